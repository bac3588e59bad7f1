package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/omnibus-go/omnibus"
	"github.com/spf13/cobra"
)

// Exit codes.
const (
	exitOK          = 0
	exitFailed      = 1
	exitUsage       = 2
	exitInterrupted = 130
)

// app is one invocation of the command: its streams and environment, so
// tests run commands in-process.
type app struct {
	stdin  io.Reader
	stdout io.Writer
	stderr io.Writer
	getenv func(string) string

	rawURL string // the URL the command resolved, for scrubbing errors
	name   string // how to show the URL, when not as rawURL redacted
}

// usageError is an error in the command line itself (exit 2).
type usageError struct{ err error }

func (e *usageError) Error() string { return e.err.Error() }
func (e *usageError) Unwrap() error { return e.err }

func usagef(format string, args ...any) error {
	return &usageError{fmt.Errorf(format, args...)}
}

// errInterrupted reports that Ctrl-C stopped send, bench or demo (exit 130).
var errInterrupted = errors.New("interrupted")

// errSilent is a failure whose explanation the command already printed.
var errSilent = errors.New("failed")

// run executes args and returns the exit code. Errors go to stderr as one
// line.
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	a := &app{stdin: stdin, stdout: stdout, stderr: stderr, getenv: os.Getenv}
	return a.run(ctx, args)
}

func (a *app) run(ctx context.Context, args []string) int {
	root := a.rootCmd()
	root.SetArgs(args)
	started := false // a command's RunE began: errors before it are usage errors
	root.PersistentPreRun = func(*cobra.Command, []string) { started = true }
	err := root.ExecuteContext(ctx)
	if err == nil {
		return exitOK
	}
	code := exitFailed
	var ue *usageError
	switch {
	case errors.Is(err, errSilent):
		return exitFailed
	case errors.Is(err, errInterrupted):
		code = exitInterrupted
	case errors.As(err, &ue) || !started:
		code = exitUsage
	}
	// One "omnibus:" at the start, however deep the wrapping.
	msg := strings.ReplaceAll(oneLine(omnibus.Redact(err.Error(), a.rawURL)), ": omnibus: ", ": ")
	if code == exitUsage && !strings.Contains(msg, "--help") {
		msg += " (see omnibus --help)"
	}
	fmt.Fprintln(a.stderr, "omnibus: "+strings.TrimPrefix(msg, "omnibus: "))
	return code
}

func (a *app) rootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:   "omnibus",
		Short: "Send, tail, measure and demonstrate messaging on any omnibus transport",
		Long: `omnibus speaks one messaging API over brokers and logs. Point it at a
transport by URL (--url, or the OMNIBUS_URL environment variable); with
neither it uses the embedded default, so nothing needs to be installed: a
NATS JetStream server inside the command, keeping its data in
$XDG_DATA_HOME/omnibus/nats (else ~/.local/share/omnibus/nats), shared
by the omnibus commands running at the same time. mem:// lives inside
one command only.

Transports linked in: ` + strings.Join(schemes(), ", ") + `.`,
		Example: `  omnibus demo
  omnibus demo --url mem://
  echo hello | omnibus send --topic greetings
  omnibus tail --topic greetings --from earliest --max 1 --json
  omnibus lag --topic orders --group billing --watch
  omnibus exporter --topic orders --group billing --metrics-addr :9464
  omnibus dlq list --topic orders
  omnibus dlq replay --topic orders --all
  omnibus console --topic orders --group billing
  omnibus bench --count 20000 --size 1024 --json`,
		SilenceErrors: true,
		SilenceUsage:  true,
	}
	root.SetIn(a.stdin)
	root.SetOut(a.stdout)
	root.SetErr(a.stderr)
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return &usageError{err} })
	root.CompletionOptions.DisableDefaultCmd = true
	root.AddCommand(a.sendCmd(), a.tailCmd(), a.lagCmd(), a.exporterCmd(), a.dlqCmd(), a.consoleCmd(), a.benchCmd(), a.demoCmd(), a.serverCmd(), a.kedaCmd(), a.versionCmd())
	return root
}

// oneLine joins the lines of a message.
func oneLine(s string) string {
	s = strings.TrimSpace(s)
	return strings.Join(strings.Fields(strings.ReplaceAll(s, "\n", " ; ")), " ")
}
