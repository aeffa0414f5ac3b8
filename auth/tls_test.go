package auth_test

import (
	"bufio"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"io"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/streamwal/streamwal/auth"
	"github.com/streamwal/streamwal/embedded"
)

// pki is a CA with a server and a client certificate, as PEM files.
type pki struct {
	ca, serverCert, serverKey, clientCert, clientKey string
}

// newPKI generates a CA (ECDSA P-256), a server certificate for 127.0.0.1
// and localhost, and a client certificate, valid for an hour, in dir.
func newPKI(t *testing.T, dir string) pki {
	t.Helper()
	caKey := newKey(t)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "streamwal test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true,
		BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	require.NoError(t, err)
	ca, err := x509.ParseCertificate(caDER)
	require.NoError(t, err)
	p := pki{ca: writePEM(t, dir, "ca.pem", "CERTIFICATE", caDER)}
	p.serverCert, p.serverKey = issue(t, dir, "server", ca, caKey, &x509.Certificate{
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, DNSNames: []string{"localhost"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
	p.clientCert, p.clientKey = issue(t, dir, "client", ca, caKey, &x509.Certificate{
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
	return p
}

// newKey is a fresh P-256 key.
func newKey(t *testing.T) *ecdsa.PrivateKey {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	return k
}

// issue signs a certificate for name (with tmpl's names and usages) by
// ca and writes it and its key; it returns their paths.
func issue(t *testing.T, dir, name string, ca *x509.Certificate, caKey *ecdsa.PrivateKey, tmpl *x509.Certificate) (string, string) {
	t.Helper()
	key := newKey(t)
	serial, err := rand.Int(rand.Reader, big.NewInt(1<<62))
	require.NoError(t, err)
	tmpl.SerialNumber, tmpl.Subject = serial, pkix.Name{CommonName: name}
	tmpl.NotBefore, tmpl.NotAfter = time.Now().Add(-time.Hour), time.Now().Add(time.Hour)
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	require.NoError(t, err)
	keyDER, err := x509.MarshalECPrivateKey(key)
	require.NoError(t, err)
	return writePEM(t, dir, name+".pem", "CERTIFICATE", der), writePEM(t, dir, name+"-key.pem", "EC PRIVATE KEY", keyDER)
}

// writePEM writes one PEM block to dir/name and returns its path.
func writePEM(t *testing.T, dir, name, kind string, der []byte) string {
	t.Helper()
	path := filepath.Join(dir, name)
	require.NoError(t, os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600))
	return path
}

// TLS end to end: a server that requires TLS and verifies client
// certificates, a coordinator, a node and a client on it with their
// certificates and seeds serve the whole workload; a plaintext
// connection, a client that does not trust the server's CA and a client
// without a certificate are refused.
func TestTLSEndToEnd(t *testing.T) {
	p := newPKI(t, t.TempDir())
	s := startSecured(t, &embedded.TLS{CertFile: p.serverCert, KeyFile: p.serverKey, CAFile: p.ca, Verify: true},
		nats.RootCAs(p.ca), nats.ClientCert(p.clientCert, p.clientKey))
	require.True(t, strings.HasPrefix(s.sys.Server.ClientURL(), "tls://"), s.sys.Server.ClientURL())
	workload(t, s)

	seed, err := s.dir.Option(auth.RoleClient)
	require.NoError(t, err)
	_, err = s.sys.Server.Connect(seed, nats.NoReconnect(), nats.ClientCert(p.clientCert, p.clientKey))
	require.ErrorContains(t, err, "certificate signed by unknown authority", "a client that does not trust the server's CA")
	_, err = s.sys.Server.Connect(seed, nats.NoReconnect(), nats.RootCAs(p.ca))
	// The handshake's failure reads "certificate required" or, when the
	// server's alert loses the race with the client's first write, a
	// closed connection.
	require.Error(t, err, "a client without a certificate")
	requirePlaintextRefused(t, s.sys.Server.Addr())
}

// requirePlaintextRefused speaks the NATS protocol in plaintext to addr
// and requires the server to close the connection without a PONG.
func requirePlaintextRefused(t *testing.T, addr string) {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 10*time.Second)
	require.NoError(t, err)
	defer func() { _ = conn.Close() }()
	require.NoError(t, conn.SetDeadline(time.Now().Add(20*time.Second)))
	r := bufio.NewReader(conn)
	info, err := r.ReadString('\n')
	require.NoError(t, err)
	require.Contains(t, info, `"tls_required":true`)
	_, err = io.WriteString(conn, "CONNECT {\"verbose\":false,\"pedantic\":false}\r\nPING\r\n")
	require.NoError(t, err)
	rest, err := io.ReadAll(r)
	var ne net.Error
	require.False(t, err != nil && errors.As(err, &ne) && ne.Timeout(), "the server never closed the plaintext connection")
	require.NotContains(t, string(rest), "PONG")
}
