package main

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"

	"github.com/spf13/cobra"
)

func (a *app) versionCmd() *cobra.Command {
	return &cobra.Command{
		Use:     "version",
		Short:   "Print the version of omnibus and the transports linked in",
		Example: `  omnibus version`,
		Args:    cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			fmt.Fprintln(a.stdout, versionLine())
			return nil
		},
	}
}

// versionLine is "omnibus VERSION (go, revision) transports: ...". The
// version is the module version from the build information, or "devel".
func versionLine() string {
	version, extra := "devel", []string{runtime.Version()}
	if bi, ok := debug.ReadBuildInfo(); ok {
		if v := bi.Main.Version; v != "" && v != "(devel)" {
			version = v
		}
		var rev, modified string
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.modified":
				modified = s.Value
			}
		}
		if rev != "" {
			if len(rev) > 12 {
				rev = rev[:12]
			}
			if modified == "true" {
				rev += "+dirty"
			}
			extra = append(extra, "rev "+rev)
		}
	}
	return fmt.Sprintf("omnibus %s (%s) transports: %s", version, strings.Join(extra, ", "), strings.Join(schemes(), ", "))
}
