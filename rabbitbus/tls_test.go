package rabbitbus

import (
	"errors"
	"net/url"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/internal/authtest"
)

// tlsPassword is the password of the TLS tests: long and odd enough that
// it appears in an error only if the error shows it.
const tlsPassword = "Pw-5a1b/amqp@secret"

// TestTLSAndAuth runs against a RabbitMQ node of the test's own that
// speaks AMQP over TLS only: a client given the right CA and password
// works, with or without a client certificate; a wrong CA, a server name
// the certificate does not hold, a wrong password and an unknown user
// are each refused at Open within authtest.Bound, saying why and without
// the password. A driver made by New logs in with its client
// certificate (SASL EXTERNAL, given with WithConfig) and a TLS
// configuration given as a Go value.
func TestTLSAndAuth(t *testing.T) {
	certs := authtest.Certs(t)
	node := startTLSNode(t, certs, []nodeUser{{"alice", tlsPassword}, {authtest.ClientName, ""}}, "rabbitmq_auth_mechanism_ssl")
	u := func(user, pass, params string) string {
		return "amqps://" + user + ":" + url.QueryEscape(pass) + "@" + node.addr() + "/?connect_timeout=10s&" + params
	}
	withCA := "tls_ca=" + certs.CA

	t.Run("password", func(t *testing.T) { authtest.Works(t, u("alice", tlsPassword, withCA)) })
	t.Run("client certificate", func(t *testing.T) {
		authtest.Works(t, u("alice", tlsPassword, withCA+"&tls_cert="+certs.ClientCert+"&tls_key="+certs.ClientKey))
	})
	t.Run("wrong CA", func(t *testing.T) {
		authtest.Refused(t, u("alice", tlsPassword, "tls_ca="+certs.OtherCA), tlsPassword, []string{"certificate signed by unknown authority"})
	})
	t.Run("system roots", func(t *testing.T) {
		authtest.Refused(t, u("alice", tlsPassword, ""), tlsPassword, []string{"certificate signed by unknown authority"})
	})
	t.Run("wrong server name", func(t *testing.T) {
		authtest.Refused(t, u("alice", tlsPassword, withCA+"&tls_server_name=rabbit.example.com"), tlsPassword, []string{"rabbit.example.com"})
	})
	t.Run("wrong password", func(t *testing.T) {
		wrong := tlsPassword + "-wrong"
		authtest.Refused(t, u("alice", wrong, withCA), wrong, []string{`authentication failed for user "alice"`})
	})
	t.Run("unknown user", func(t *testing.T) {
		authtest.Refused(t, u("mallory", tlsPassword, withCA), tlsPassword, []string{`authentication failed for user "mallory"`})
	})
	t.Run("no TLS", func(t *testing.T) {
		plain := "amqp://alice:" + url.QueryEscape(tlsPassword) + "@" + node.addr() + "/?connect_timeout=10s"
		authtest.Refused(t, plain, tlsPassword, []string{"amqps://"})
	})

	external := WithConfig(amqp.Config{SASL: []amqp.Authentication{&amqp.ExternalAuth{}}})
	bare := "amqps://" + node.addr() + "/?connect_timeout=10s"
	t.Run("certificate login (New)", func(t *testing.T) {
		authtest.Works(t, bare, omnibus.WithDriver(New(WithTLS(certs.Client()), external)))
	})
	t.Run("certificate login without a certificate", func(t *testing.T) {
		noCert := certs.Client()
		noCert.Certificates = nil
		authtest.Refused(t, bare, "", []string{"authentication failed for SASL EXTERNAL"}, omnibus.WithDriver(New(WithTLS(noCert), external)))
	})
	t.Run("conflicts", func(t *testing.T) {
		for _, tt := range []struct {
			url  string
			d    Driver
			want string
		}{
			{"amqp://" + node.addr() + "/", New(WithTLS(certs.Client())), "WithTLS needs the amqps scheme"},
			{bare + "&tls_ca=" + certs.CA, New(WithTLS(certs.Client())), "tls_ca and WithTLS"},
			{bare, New(WithConfig(amqp.Config{Vhost: "other"})), "Vhost"},
			{bare, New(WithConfig(amqp.Config{TLSClientConfig: certs.Client()})), "WithTLS"},
			{bare, New(WithConfig(amqp.Config{Recovery: &amqp.Recovery{}})), "reconnects"},
		} {
			err := authtest.Refused(t, tt.url, "", []string{tt.want}, omnibus.WithDriver(tt.d))
			if !errors.Is(err, omnibus.ErrInvalid) {
				t.Errorf("Open(%s): %v, want ErrInvalid", tt.url, err)
			}
		}
	})
}
