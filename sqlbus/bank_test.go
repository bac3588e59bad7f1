package sqlbus_test

import (
	"context"
	"errors"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/sqlbus"
)

func runBank(ctx context.Context, st *sqlbus.SQLStore, c *omnibus.Client, cfg childConfig) error {
	return errors.New("not yet")
}
