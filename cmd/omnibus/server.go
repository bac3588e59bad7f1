package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/omnibus-go/omnibus/natsbus"
	"github.com/spf13/cobra"
)

func (a *app) serverCmd() *cobra.Command {
	var dir string
	cmd := &cobra.Command{
		Use:   "server [--dir DIR]",
		Short: "Run the embedded default's NATS server in the foreground",
		Long: `server runs the NATS JetStream server of the embedded default until
Ctrl-C, and says where it listens. While it runs, every omnibus command on
the default URL (and any NATS client, at the address it prints) uses it;
without it, the first command to need the server runs it and the others
connect to that one. Its data stays in the per-user data directory
($XDG_DATA_HOME/omnibus/nats, else ~/.local/share/omnibus/nats), or in
--dir. It fails, naming the process, when a server already runs there.`,
		Example: `  omnibus server
  omnibus server --dir /tmp/omnibus-data`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return a.server(cmd.Context(), dir) },
	}
	cmd.Flags().StringVar(&dir, "dir", "", "data directory (default: the per-user data directory)")
	return cmd
}

func (a *app) server(ctx context.Context, dir string) error {
	if dir == "" {
		d, err := natsbus.DefaultDir()
		if err != nil {
			return err
		}
		dir = d
	}
	octx, cancel := context.WithTimeout(ctx, openTimeout)
	defer cancel()
	s, err := natsbus.StartServer(octx, natsbus.ServerConfig{Dir: dir})
	if err != nil {
		return err
	}
	fmt.Fprintf(a.stdout, "embedded NATS JetStream server listening on %s, data in %s\n", s.URL(), s.Dir())
	fmt.Fprintln(a.stdout, "omnibus commands on the default URL use it, as can any NATS client at that address; Ctrl-C stops it")
	<-ctx.Done()
	if err := s.Close(); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}
