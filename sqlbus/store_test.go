package sqlbus_test

import (
	"testing"

	"github.com/omnibus-go/omnibus/sqlbus"
	"github.com/omnibus-go/omnibus/sqlbus/storetest"
)

// TestStore runs the store conformance suite on every database.
func TestStore(t *testing.T) {
	for _, db := range databases {
		t.Run(db.name, func(t *testing.T) {
			sdb := openDB(t, db)
			storetest.Run(t, storetest.Harness{
				New:        func(t *testing.T) sqlbus.Store { return newStore(t, sdb, db.dialect) },
				SkipLocked: db.dialect != sqlbus.SQLite,
			})
		})
	}
}
