package brokertest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
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

// CA is a throwaway certificate authority for tests of TLS connections:
// its certificate is in File (PEM) and Pool, and Issue signs leaf
// certificates for 127.0.0.1 and localhost. Its methods are for the
// test's goroutine.
type CA struct {
	File string         // static: the CA certificate, PEM
	Pool *x509.CertPool // static: holds the CA certificate

	cert   *x509.Certificate
	key    *ecdsa.PrivateKey
	serial int64
}

// NewCA makes a CA whose certificate is written in t.TempDir().
func NewCA(t testing.TB) *CA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatalf("brokertest: CA key: %v", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "fanwire test CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatalf("brokertest: CA certificate: %v", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatalf("brokertest: CA certificate: %v", err)
	}
	ca := &CA{File: filepath.Join(t.TempDir(), "ca.pem"), Pool: x509.NewCertPool(), cert: cert, key: key, serial: 1}
	ca.Pool.AddCert(cert)
	writePEM(t, ca.File, "CERTIFICATE", der)
	return ca
}

// Issue signs a certificate named name (its common name) for 127.0.0.1,
// ::1 and localhost, good for a server and a client, and writes it and its
// key as PEM to dir/name.pem and dir/name-key.pem, replacing any there
// (each by a rename, so a reader never sees half a file). It is valid
// for a day.
func (ca *CA) Issue(t testing.TB, dir, name string) (certFile, keyFile string) {
	t.Helper()
	return ca.IssueUntil(t, dir, name, time.Now().Add(24*time.Hour))
}

// IssueUntil is Issue with the certificate's notAfter.
func (ca *CA) IssueUntil(t testing.TB, dir, name string, notAfter time.Time) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatalf("brokertest: key for %s: %v", name, err)
	}
	ca.serial++
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(ca.serial),
		Subject:      pkix.Name{CommonName: name},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		DNSNames:     []string{"localhost"},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatalf("brokertest: certificate for %s: %v", name, err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatalf("brokertest: key for %s: %v", name, err)
	}
	certFile, keyFile = filepath.Join(dir, name+".pem"), filepath.Join(dir, name+"-key.pem")
	writePEM(t, certFile, "CERTIFICATE", der)
	writePEM(t, keyFile, "PRIVATE KEY", keyDER)
	return certFile, keyFile
}

// writePEM writes one PEM block to path through a temporary file and a
// rename.
func writePEM(t testing.TB, path, typ string, der []byte) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatalf("brokertest: %v", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatalf("brokertest: %v", err)
	}
}
