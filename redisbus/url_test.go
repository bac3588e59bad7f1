package redisbus

import (
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/omnibus-go/omnibus/driver"
)

func parse(t *testing.T, raw string) (*config, error) {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	return parseURL(u)
}

func TestParseURL(t *testing.T) {
	cfg, err := parse(t, "redis://localhost")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.addr != "localhost:6379" || cfg.db != 0 || cfg.name != "omnibus" || cfg.claimIdle != DefaultClaimIdle ||
		cfg.leaseTTL != DefaultLeaseTTL || cfg.partitions != 0 || cfg.tls != nil || cfg.password != "" || cfg.trims() {
		t.Errorf("defaults: %+v", cfg)
	}
	for raw, want := range map[string]struct {
		addr, user, password string
		db                   int
	}{
		"redis://:s3cret@h:7000/2":      {"h:7000", "", "s3cret", 2},
		"redis://app:s3cret@h?db=3":     {"h:6379", "app", "s3cret", 3},
		"redis://s3cret@h":              {"h:6379", "", "s3cret", 0},
		"redis://[::1]:6380":            {"[::1]:6380", "", "", 0},
		"redis://[::1]":                 {"[::1]:6379", "", "", 0},
		"redis://h/":                    {"h:6379", "", "", 0},
		"redis://:p%2Fw@h:1/4?name=svc": {"h:1", "", "p/w", 4},
	} {
		cfg, err := parse(t, raw)
		if err != nil {
			t.Errorf("%s: %v", raw, err)
			continue
		}
		if cfg.addr != want.addr || cfg.user != want.user || cfg.password != want.password || cfg.db != want.db {
			t.Errorf("%s: addr %q user %q password %q db %d, want %+v", raw, cfg.addr, cfg.user, cfg.password, cfg.db, want)
		}
		if strings.Contains(cfg.redacted, "s3cret") {
			t.Errorf("%s: redacted %q shows the password", raw, cfg.redacted)
		}
	}
	cfg, err = parse(t, "redis://h?partitions=8&lease_ttl=3s&rebalance_interval=250ms&claim_idle=2s&maxlen=100&max_age=1h&trim_unread=true&max_message_bytes=1024&wait_timeout=1s&tls=true&pool_size=4&dial_timeout=2s")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.partitions != 8 || cfg.leaseTTL != 3*time.Second || cfg.rebalance != 250*time.Millisecond || cfg.claimIdle != 2*time.Second ||
		cfg.maxLen != 100 || cfg.maxAge != time.Hour || !cfg.trimUnread || cfg.maxBytes != 1024 || cfg.waitTO != time.Second ||
		cfg.tls == nil || cfg.tls.ServerName != "h" || cfg.poolSize != 4 || cfg.dialTO != 2*time.Second || !cfg.trims() {
		t.Errorf("parameters: %+v", cfg)
	}
	for _, raw := range []string{"redis://h?pool_size=0", "redis://h?rebalance_interval=0s", "redis://h?wait_timeout=-1s"} {
		if _, err := parse(t, raw); !errors.Is(err, driver.ErrInvalid) {
			t.Errorf("%s: got %v, want ErrInvalid", raw, err)
		}
	}
}
