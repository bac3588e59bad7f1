package main

// laneStatus is the health of one lane of a consumer group, judged from a
// sliding window of lag samples, after Burrow's evaluation rules.
type laneStatus string

const (
	// statusOK: the lane is caught up (zero lag somewhere in the window) or
	// its lag is falling.
	statusOK laneStatus = "OK"
	// statusEarly: the lane has lag and one sample is too few to judge
	// its trend (the first report of --watch).
	statusEarly laneStatus = "EARLY"
	// statusWarn: the lag grew (or held) across the window while the group
	// made progress: the consumers are alive but falling behind.
	statusWarn laneStatus = "WARN"
	// statusStall: there is lag and no progress across the window while the
	// group still has members: something is stuck (a poison message).
	statusStall laneStatus = "STALL"
	// statusStop: there is lag and the group stopped committing: it has no
	// members left.
	statusStop laneStatus = "STOP"
	// statusUnknown: the latest lag read failed. Never read as zero.
	statusUnknown laneStatus = "UNKNOWN"
)

// severity orders statuses from healthy to worst.
func (s laneStatus) severity() int {
	switch s {
	case statusOK:
		return 0
	case statusEarly:
		return 1
	case statusWarn:
		return 2
	case statusStall:
		return 4
	case statusStop:
		return 5
	}
	return 3 // statusUnknown
}

// worst returns the most severe of ss (OK when empty).
func worst(ss ...laneStatus) laneStatus {
	w := statusOK
	for _, s := range ss {
		if s.severity() > w.severity() {
			w = s
		}
	}
	return w
}

// lagPoint is one sample of one lane.
type lagPoint struct {
	Lag   int64
	Known bool // false when the transport could not read the lag
	// Committed is the group's committed position on the lane, -1 when
	// the transport does not report it. When unknown, progress is
	// inferred from the lag falling between two samples.
	Committed int64
	// Members is the number of members of the group, -1 when unknown.
	Members int
}

// classify judges a lane from its window of samples, oldest first.
func classify(window []lagPoint) laneStatus {
	var known []lagPoint
	for _, p := range window {
		if p.Known {
			known = append(known, p)
		}
	}
	if len(window) == 0 || !window[len(window)-1].Known {
		return statusUnknown
	}
	last := known[len(known)-1]
	for _, p := range known {
		if p.Lag == 0 {
			return statusOK // caught up within the window
		}
	}
	if last.Members == 0 {
		return statusStop
	}
	if len(known) < 2 {
		return statusEarly
	}
	first := known[0]
	progress := false
	if first.Committed >= 0 && last.Committed >= 0 {
		progress = last.Committed > first.Committed
	} else {
		for i := 1; i < len(known); i++ {
			if known[i].Lag < known[i-1].Lag {
				progress = true
				break
			}
		}
	}
	switch {
	case !progress && first.Committed < 0 && last.Lag > first.Lag:
		// Lag grows and the transport cannot say whether the group commits:
		// falling behind at the least.
		return statusWarn
	case !progress:
		return statusStall
	case last.Lag >= first.Lag:
		return statusWarn
	}
	return statusOK
}
