package nsqtest

// The child's side: running nsqd or nsqlookupd from the nsq module's
// packages until SIGINT or SIGTERM, or until the parent is gone.

import (
	"net"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/nsqio/nsq/nsqd"
	"github.com/nsqio/nsq/nsqlookupd"
)

// logWarn is nsqd's and nsqlookupd's log level WARN (their lg package
// is internal to the nsq module).
const logWarn = 3

func runNSQD(cfg child) error {
	opts := nsqd.NewOptions()
	opts.LogLevel = logWarn
	opts.TCPAddress = net.JoinHostPort(loopback, strconv.Itoa(cfg.TCP))
	opts.HTTPAddress = net.JoinHostPort(loopback, strconv.Itoa(cfg.HTTP))
	opts.HTTPSAddress = ""
	opts.BroadcastAddress = loopback
	opts.DataPath = cfg.Dir
	if cfg.MsgTimeout > 0 {
		opts.MsgTimeout = cfg.MsgTimeout
	}
	if cfg.MaxMsgSize > 0 {
		opts.MaxMsgSize = cfg.MaxMsgSize
		opts.MaxBodySize = max(opts.MaxBodySize, 4*cfg.MaxMsgSize)
	}
	if cfg.MemQueueSize > 0 {
		opts.MemQueueSize = cfg.MemQueueSize
	}
	if cfg.LookupdTCP != "" {
		opts.NSQLookupdTCPAddresses = []string{cfg.LookupdTCP}
	}
	if cfg.AuthHTTPAddress != "" {
		opts.AuthHTTPAddresses = []string{cfg.AuthHTTPAddress}
	}
	n, err := nsqd.New(opts)
	if err != nil {
		return err
	}
	if err := n.LoadMetadata(); err != nil {
		return err
	}
	if err := n.PersistMetadata(); err != nil {
		return err
	}
	return serve(n.Main, n.Exit)
}

func runLookupd(cfg child) error {
	opts := nsqlookupd.NewOptions()
	opts.LogLevel = logWarn
	opts.TCPAddress = net.JoinHostPort(loopback, strconv.Itoa(cfg.TCP))
	opts.HTTPAddress = net.JoinHostPort(loopback, strconv.Itoa(cfg.HTTP))
	opts.BroadcastAddress = loopback
	l, err := nsqlookupd.New(opts)
	if err != nil {
		return err
	}
	return serve(l.Main, l.Exit)
}

// serve runs main until it fails, a signal comes or the parent process
// is gone, and then exit.
func serve(main func() error, exit func()) error {
	failed := make(chan error, 1)
	go func() { failed <- main() }()
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	parent := os.Getppid()
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case err := <-failed:
			exit()
			return err
		case <-sig:
			exit()
			return nil
		case <-tick.C:
			if os.Getppid() != parent {
				exit()
				return nil
			}
		}
	}
}
