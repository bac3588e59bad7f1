package natsbus_test

import (
	"crypto/tls"
	"errors"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/internal/authtest"
	"github.com/omnibus-go/omnibus/natsbus"
)

// tlsPassword is the password of the TLS tests: long and odd enough that
// it appears in an error only if the error shows it.
const tlsPassword = "Pw-3c9e/nats@secret"

// tlsServer starts a NATS server with JetStream in the process that
// speaks TLS only (client certificates as auth says) and lets in the
// user alice with tlsPassword and the nkey user whose seed is in the
// returned file. It returns the server's host:port; the server stops
// at cleanup.
func tlsServer(t *testing.T, certs *authtest.Set, auth tls.ClientAuthType) (addr, seedFile string) {
	t.Helper()
	user, seed := nkeyUser(t)
	pub, err := user.PublicKey()
	if err != nil {
		t.Fatal(err)
	}
	s := startServer(t, &server.Options{
		TLS:        true,
		TLSConfig:  certs.Server(auth),
		TLSTimeout: 2,
		Users:      []*server.User{{Username: "alice", Password: tlsPassword}},
		Nkeys:      []*server.NkeyUser{{Nkey: pub}},
	})
	return s.Addr().String(), seed
}

// nkeyUser makes an nkey user and writes its seed to a file.
func nkeyUser(t *testing.T) (nkeys.KeyPair, string) {
	t.Helper()
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	seed, err := kp.Seed()
	if err != nil {
		t.Fatal(err)
	}
	f := filepath.Join(t.TempDir(), "user.nk")
	if err := os.WriteFile(f, seed, 0o600); err != nil {
		t.Fatal(err)
	}
	return kp, f
}

// TestTLSAndAuth: on a server that speaks only TLS and wants a user, a
// client given the right CA and a user and password, or an nkey, works;
// a wrong CA, a server name the certificate does not hold, a wrong
// password, an unknown nkey and no credentials are each refused at Open
// within authtest.Bound, saying why and without the password.
func TestTLSAndAuth(t *testing.T) {
	certs := authtest.Certs(t)
	addr, seed := tlsServer(t, certs, tls.NoClientCert)
	u := func(userinfo, params string) string {
		return "nats://" + userinfo + addr + "?connect_timeout=10s&" + params
	}
	alice := "alice:" + url.QueryEscape(tlsPassword) + "@"
	withCA := "tls_ca=" + certs.CA

	t.Run("password", func(t *testing.T) { authtest.Works(t, u(alice, withCA)) })
	t.Run("nkey", func(t *testing.T) { authtest.Works(t, u("", withCA+"&nkey="+seed)) })
	t.Run("wrong CA", func(t *testing.T) {
		authtest.Refused(t, u(alice, "tls_ca="+certs.OtherCA), tlsPassword, []string{"certificate signed by unknown authority"})
	})
	t.Run("system roots", func(t *testing.T) {
		authtest.Refused(t, u(alice, "tls=true"), tlsPassword, []string{"certificate signed by unknown authority"})
	})
	t.Run("wrong server name", func(t *testing.T) {
		authtest.Refused(t, u(alice, withCA+"&tls_server_name=nats.example.com"), tlsPassword, []string{"nats.example.com"})
	})
	t.Run("wrong password", func(t *testing.T) {
		wrong := tlsPassword + "-wrong"
		authtest.Refused(t, u("alice:"+url.QueryEscape(wrong)+"@", withCA), wrong, []string{"refused the password of user \"alice\"", "authorization violation"})
	})
	t.Run("unknown nkey", func(t *testing.T) {
		_, other := nkeyUser(t)
		authtest.Refused(t, u("", withCA+"&nkey="+other), "", []string{"refused the nkey of", "authorization violation"})
	})
	t.Run("no credentials", func(t *testing.T) {
		authtest.Refused(t, u("", withCA), "", []string{"refused the client (no credentials in the URL)"})
	})
	t.Run("no TLS", func(t *testing.T) {
		// The server says it wants TLS; nats.go then upgrades by itself,
		// with the system's roots, which do not hold the test's CA.
		authtest.Refused(t, u(alice, ""), tlsPassword, []string{"certificate"})
	})
}

// TestTLSClientCertificate: a server that requires client certificates
// takes the one named by tls_cert and tls_key, and refuses a client
// without one at Open, fast.
func TestTLSClientCertificate(t *testing.T) {
	certs := authtest.Certs(t)
	addr, _ := tlsServer(t, certs, tls.RequireAndVerifyClientCert)
	base := "nats://alice:" + url.QueryEscape(tlsPassword) + "@" + addr + "?tls_ca=" + certs.CA
	authtest.Works(t, base+"&tls_cert="+certs.ClientCert+"&tls_key="+certs.ClientKey)
	authtest.Refused(t, base, tlsPassword, []string{"certificate"})
}

// TestEmbeddedTakesNoTLS: TLS and credential parameters on the embedded
// server's URL are an error, not settings silently ignored.
func TestEmbeddedTakesNoTLS(t *testing.T) {
	for _, p := range []string{"tls=true", "tls_ca=/ca.pem", "tls_server_name=x", "creds=/u.creds", "nkey=/u.nk"} {
		name, _, _ := strings.Cut(p, "=")
		authtest.Refused(t, "nats://embedded?dir="+url.QueryEscape(t.TempDir())+"&"+p, "", []string{"embedded", name})
	}
}

// TestTypedConfiguration: a driver made by New takes its TLS
// configuration and nats.go options as Go values, on a URL that has
// neither, or a connection of the caller's, which closing the client
// leaves open. What the URL says that the options take the place of is
// an error.
func TestTypedConfiguration(t *testing.T) {
	certs := authtest.Certs(t)
	addr, _ := tlsServer(t, certs, tls.RequireAndVerifyClientCert)
	bare := "nats://" + addr

	t.Run("WithTLS and WithOptions", func(t *testing.T) {
		d := natsbus.New(natsbus.WithTLS(certs.Client()), natsbus.WithOptions(nats.UserInfo("alice", tlsPassword)))
		authtest.Works(t, bare, omnibus.WithDriver(d))
		wrong := natsbus.New(natsbus.WithTLS(certs.Client()), natsbus.WithOptions(nats.UserInfo("alice", "not-"+tlsPassword)))
		authtest.Refused(t, bare, tlsPassword, []string{"authorization violation"}, omnibus.WithDriver(wrong))
	})
	t.Run("WithConn", func(t *testing.T) {
		nc, err := nats.Connect("tls://"+addr, nats.Secure(certs.Client()), nats.UserInfo("alice", tlsPassword))
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		c := authtest.Works(t, bare, omnibus.WithDriver(natsbus.New(natsbus.WithConn(nc))))
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
		if err := nc.Publish("after.close", nil); err != nil || !nc.IsConnected() {
			t.Errorf("the caller's connection after the client closed: connected %v, publish: %v", nc.IsConnected(), err)
		}
	})
	t.Run("conflicts", func(t *testing.T) {
		nc, err := nats.Connect("tls://"+addr, nats.Secure(certs.Client()), nats.UserInfo("alice", tlsPassword))
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		withConn := omnibus.WithDriver(natsbus.New(natsbus.WithConn(nc)))
		withTLS := omnibus.WithDriver(natsbus.New(natsbus.WithTLS(certs.Client())))
		for _, tt := range []struct {
			url  string
			opt  omnibus.Option
			want string
		}{
			{"nats://alice:" + url.QueryEscape(tlsPassword) + "@" + addr, withConn, "credentials with WithConn"},
			{bare + "?tls_ca=" + certs.CA, withConn, "tls_ca with WithConn"},
			{bare + "?max_reconnects=3", withConn, "max_reconnects with WithConn"},
			{"nats://embedded?dir=" + url.QueryEscape(t.TempDir()), withConn, "not nats://embedded"},
			{bare + "?tls_ca=" + certs.CA, withTLS, "tls_ca and WithTLS"},
			{bare, omnibus.WithDriver(natsbus.New(natsbus.WithConn(nc), natsbus.WithOptions(nats.Name("x")))), "WithOptions cannot shape it"},
		} {
			err := authtest.Refused(t, tt.url, tlsPassword, []string{tt.want}, tt.opt)
			if !errors.Is(err, omnibus.ErrInvalid) {
				t.Errorf("Open(%s): %v, want ErrInvalid", omnibus.RedactURL(tt.url), err)
			}
		}
		if !nc.IsConnected() {
			t.Error("a refused Open closed the caller's connection")
		}
	})
}

// authToken is the token of TestTokenAuth: long and odd enough that it
// appears in an error or a log line only if they show it.
const authToken = "Tk-9f41/nats@token-secret"

// TestTokenAuth: on a server of the test's own that wants a token, the
// URL's token (user info without a password) gets in and works end to
// end; a wrong token and no token are refused at Open within
// authtest.Bound, saying the token was refused, with neither the token
// given nor the server's in the error or in anything the client logged.
func TestTokenAuth(t *testing.T) {
	addr := startServer(t, &server.Options{Authorization: authToken}).Addr().String()
	var logs strings.Builder
	var mu sync.Mutex
	logger := slog.New(slog.NewTextHandler(writerFunc(func(p []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		return logs.Write(p)
	}), &slog.HandlerOptions{Level: slog.LevelDebug}))
	withLog := omnibus.WithLogger(logger)
	u := func(token string) string {
		if token == "" {
			return "nats://" + addr + "?connect_timeout=10s"
		}
		return "nats://" + url.User(token).String() + "@" + addr + "?connect_timeout=10s"
	}

	t.Run("right token", func(t *testing.T) { authtest.Works(t, u(authToken), withLog) })
	wrong := "wrong-" + authToken
	t.Run("wrong token", func(t *testing.T) {
		err := authtest.Refused(t, u(wrong), wrong, []string{"refused the token", "authorization violation"}, withLog)
		if strings.Contains(err.Error(), authToken) {
			t.Errorf("error shows the server's token: %v", err)
		}
	})
	t.Run("no token", func(t *testing.T) {
		authtest.Refused(t, u(""), authToken, []string{"refused the client (no credentials in the URL)"}, withLog)
	})
	mu.Lock()
	defer mu.Unlock()
	for _, secret := range []string{authToken, url.User(authToken).String(), wrong, url.User(wrong).String()} {
		if strings.Contains(logs.String(), secret) {
			t.Errorf("the client's log shows the token:\n%s", logs.String())
		}
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }
