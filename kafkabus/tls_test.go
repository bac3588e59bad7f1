package kafkabus_test

import (
	"crypto/tls"
	"errors"
	"net/url"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/internal/authtest"
	"github.com/omnibus-go/omnibus/kafkabus"
)

// tlsPassword is the SASL password of the TLS tests: long and odd enough
// that it appears in an error only if the error shows it.
const tlsPassword = "Pw-7d2f/kafka@secret"

// TestTLSAndSASL: on brokers that speak only TLS and want SASL, a client
// given the right CA and credentials works with each mechanism; a wrong
// CA, a server name the certificate does not hold and a wrong password
// are each refused at Open within authtest.Bound, saying why and without
// the password.
func TestTLSAndSASL(t *testing.T) {
	certs := authtest.Certs(t)
	for _, mech := range []string{"PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"} {
		t.Run(mech, func(t *testing.T) {
			cluster := newCluster(t, kfake.TLS(certs.Server(tls.NoClientCert)), kfake.EnableSASL(),
				kfake.Superuser(mech, "alice", tlsPassword))
			hosts := strings.Join(cluster.ListenAddrs(), ",")
			u := func(pass, params string) string {
				return "kafkas://alice:" + url.QueryEscape(pass) + "@" + hosts + "?" + testParams +
					"&mechanism=" + mech + "&" + params
			}
			withCA := "tls_ca=" + certs.CA

			authtest.Works(t, u(tlsPassword, withCA))
			t.Run("wrong CA", func(t *testing.T) {
				authtest.Refused(t, u(tlsPassword, "tls_ca="+certs.OtherCA), tlsPassword,
					[]string{"certificate signed by unknown authority"})
			})
			t.Run("system roots", func(t *testing.T) {
				authtest.Refused(t, u(tlsPassword, ""), tlsPassword, []string{"certificate signed by unknown authority"})
			})
			t.Run("wrong server name", func(t *testing.T) {
				authtest.Refused(t, u(tlsPassword, withCA+"&tls_server_name=kafka.example.com"), tlsPassword,
					[]string{"kafka.example.com"})
			})
			t.Run("wrong password", func(t *testing.T) {
				wrong := tlsPassword + "-wrong"
				authtest.Refused(t, u(wrong, withCA), wrong, []string{"authentication"})
			})
			t.Run("no TLS", func(t *testing.T) {
				plain := "kafka://alice:" + url.QueryEscape(tlsPassword) + "@" + hosts + "?" + testParams + "&mechanism=" + mech
				authtest.Refused(t, plain, tlsPassword, nil)
			})
		})
	}
}

// TestTLSClientCertificate: brokers that require a client certificate
// take the one named by tls_cert and tls_key, and refuse a client
// without one at Open, fast.
func TestTLSClientCertificate(t *testing.T) {
	certs := authtest.Certs(t)
	cluster := newCluster(t, kfake.TLS(certs.Server(tls.RequireAndVerifyClientCert)))
	base := "kafkas://" + strings.Join(cluster.ListenAddrs(), ",") + "?" + testParams + "&tls_ca=" + certs.CA
	authtest.Works(t, base+"&tls_cert="+certs.ClientCert+"&tls_key="+certs.ClientKey)
	authtest.Refused(t, base, "", []string{"certificate"})
}

// TestTLSParametersNeedTLS: a tls_* parameter on a URL without TLS is an
// error, not a setting silently ignored; so is half a key pair.
func TestTLSParametersNeedTLS(t *testing.T) {
	for _, raw := range []string{
		"kafka://127.0.0.1:1?tls_ca=/ca.pem",
		"kafka://127.0.0.1:1?tls_server_name=kafka.example.com",
		"kafka://127.0.0.1:1?tls_cert=/c.pem&tls_key=/k.pem",
		"kafkas://127.0.0.1:1?tls=false&tls_ca=/ca.pem",
		"kafkas://127.0.0.1:1?tls_cert=/c.pem",
	} {
		t.Run(raw, func(t *testing.T) {
			err := authtest.Refused(t, raw, "", []string{"tls_"})
			if !errors.Is(err, omnibus.ErrInvalid) {
				t.Errorf("Open(%q) = %v, want ErrInvalid", raw, err)
			}
		})
	}
}

// TestTypedConfiguration: a driver made by New takes its TLS
// configuration and its SASL mechanism as Go values, on a URL that has
// neither; every client it makes gets them (the brokers want both for
// every request, so publishing and consuming show it). A tls parameter
// beside WithTLS is an error.
func TestTypedConfiguration(t *testing.T) {
	certs := authtest.Certs(t)
	cluster := newCluster(t, kfake.TLS(certs.Server(tls.RequireAndVerifyClientCert)), kfake.EnableSASL(),
		kfake.Superuser("SCRAM-SHA-512", "bob", tlsPassword))
	base := "kafka://" + strings.Join(cluster.ListenAddrs(), ",") + "?" + testParams
	d := kafkabus.New(
		kafkabus.WithTLS(certs.Client()),
		kafkabus.WithClientOpts(kgo.SASL(scram.Auth{User: "bob", Pass: tlsPassword}.AsSha512Mechanism())),
	)
	authtest.Works(t, base, omnibus.WithDriver(d))

	wrong := kafkabus.New(kafkabus.WithTLS(certs.Client()),
		kafkabus.WithClientOpts(kgo.SASL(scram.Auth{User: "bob", Pass: "not-" + tlsPassword}.AsSha512Mechanism())))
	authtest.Refused(t, base, tlsPassword, []string{"SCRAM-SHA-512 authentication failed"}, omnibus.WithDriver(wrong))

	err := authtest.Refused(t, base+"&tls_ca="+certs.CA, "", []string{"tls_ca", "WithTLS"}, omnibus.WithDriver(d))
	if !errors.Is(err, omnibus.ErrInvalid) {
		t.Errorf("tls_ca with WithTLS: %v, want ErrInvalid", err)
	}
}
