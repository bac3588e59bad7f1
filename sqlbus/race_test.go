//go:build race

package sqlbus_test

// raceEnabled: the tests run with the race detector.
const raceEnabled = true
