package authtest

// Certificates, made with crypto/x509: a CA, a server certificate for
// 127.0.0.1 and localhost signed by it, a client certificate signed by
// it, and a second CA that signed neither (the wrong CA a client may be
// given). They are written as PEM files to the test's temporary
// directory, for servers and URLs that take file names, and offered as
// tls.Configs.

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// ServerName is a name the server certificate holds besides 127.0.0.1.
const ServerName = "localhost"

// ClientName is the common name of the client certificate: the user name
// servers that log in by certificate see.
const ClientName = "omnibus-client"

// Set is one test's certificates. The fields are PEM file paths.
type Set struct {
	CA         string // the CA that signed the server and client certificates
	OtherCA    string // a CA that signed nothing here
	ServerCert string // for 127.0.0.1 and localhost
	ServerKey  string
	ClientCert string // common name ClientName, for client authentication
	ClientKey  string

	pool   *x509.CertPool
	server tls.Certificate
	client tls.Certificate
}

// Certs makes a Set in t's temporary directory.
func Certs(t testing.TB) *Set {
	t.Helper()
	dir := t.TempDir()
	now := time.Now()
	ca, caKey := issue(t, "omnibus test CA", nil, nil, now, func(c *x509.Certificate) {
		c.IsCA, c.BasicConstraintsValid = true, true
		c.KeyUsage = x509.KeyUsageCertSign | x509.KeyUsageCRLSign
	})
	other, _ := issue(t, "omnibus other CA", nil, nil, now, func(c *x509.Certificate) {
		c.IsCA, c.BasicConstraintsValid = true, true
		c.KeyUsage = x509.KeyUsageCertSign | x509.KeyUsageCRLSign
	})
	srv, srvKey := issue(t, ServerName, ca, caKey, now, func(c *x509.Certificate) {
		c.DNSNames = []string{ServerName}
		c.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}
		c.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		c.KeyUsage = x509.KeyUsageDigitalSignature
	})
	cli, cliKey := issue(t, ClientName, ca, caKey, now, func(c *x509.Certificate) {
		c.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
		c.KeyUsage = x509.KeyUsageDigitalSignature
	})
	s := &Set{
		CA:         write(t, dir, "ca.pem", certPEM(ca)),
		OtherCA:    write(t, dir, "other-ca.pem", certPEM(other)),
		ServerCert: write(t, dir, "server.pem", certPEM(srv)),
		ServerKey:  write(t, dir, "server-key.pem", keyPEM(t, srvKey)),
		ClientCert: write(t, dir, "client.pem", certPEM(cli)),
		ClientKey:  write(t, dir, "client-key.pem", keyPEM(t, cliKey)),
		pool:       x509.NewCertPool(),
	}
	s.pool.AddCert(ca)
	s.server = tls.Certificate{Certificate: [][]byte{srv.Raw}, PrivateKey: srvKey, Leaf: srv}
	s.client = tls.Certificate{Certificate: [][]byte{cli.Raw}, PrivateKey: cliKey, Leaf: cli}
	return s
}

// Server is the server's TLS configuration: its certificate, and client
// certificates verified against the CA as auth says.
func (s *Set) Server(auth tls.ClientAuthType) *tls.Config {
	return &tls.Config{
		Certificates: []tls.Certificate{s.server},
		ClientCAs:    s.pool,
		ClientAuth:   auth,
		MinVersion:   tls.VersionTLS12,
	}
}

// Client is a client's TLS configuration trusting the CA and presenting
// the client certificate.
func (s *Set) Client() *tls.Config {
	return &tls.Config{
		RootCAs:      s.pool,
		Certificates: []tls.Certificate{s.client},
		MinVersion:   tls.VersionTLS12,
	}
}

// issue makes a certificate for name signed by parent (self-signed when
// parent is nil), shaped by edit.
func issue(t testing.TB, name string, parent *x509.Certificate, parentKey *ecdsa.PrivateKey, now time.Time, edit func(*x509.Certificate)) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: name, Organization: []string{"omnibus tests"}},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(24 * time.Hour),
	}
	edit(tmpl)
	if parent == nil {
		parent, parentKey = tmpl, key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, parentKey)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return cert, key
}

func certPEM(c *x509.Certificate) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})
}

func keyPEM(t testing.TB, k *ecdsa.PrivateKey) []byte {
	t.Helper()
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})
}

func write(t testing.TB, dir, name string, data []byte) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}
