package gateway_test

import (
	"crypto/tls"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fanwire/fanwire/broker/brokertest"
	"github.com/fanwire/fanwire/gateway/tlscert"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// TestCertReloadRetriesAFailedPair: a renewal caught half written (the new
// certificate beside the old key) fails to load; the old certificate is
// still served, the failure logged and counted; when the key arrives with
// the same size and time stamp as the old one (one key type; rsync -t, a
// coarse file system), the next check loads the pair: a failed load is
// tried again until the files load, not only when they change again.
func TestCertReloadRetriesAFailedPair(t *testing.T) {
	ca := brokertest.NewCA(t)
	dir := t.TempDir()
	certFile, keyFile := ca.Issue(t, dir, "old")
	core, logs := observer.New(zap.WarnLevel)
	// An hour between checks: only CheckCertFiles looks at the files.
	certs, err := tlscert.New(certFile, keyFile, time.Hour, zap.New(core))
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(certs.Collector())
	served := tlsServer(t, certs.TLSConfig(), ca)

	keyInfo, err := os.Stat(keyFile)
	if err != nil {
		t.Fatal(err)
	}
	newCert, newKey := ca.Issue(t, t.TempDir(), "new")
	replace(t, newCert, certFile) // the certificate first
	certs.Reload()
	if got := served(); got != "old" {
		t.Fatalf("with the new certificate and the old key, handshakes see %q, want old", got)
	}
	if n := logs.FilterMessageSnippet("do not load").Len(); n != 1 {
		t.Errorf("%d warnings for a pair that does not load, want 1", n)
	}
	certs.Reload() // still half: counted, not logged again
	if n := logs.FilterMessageSnippet("do not load").Len(); n != 1 {
		t.Errorf("%d warnings after the same failure twice, want 1", n)
	}

	// The key arrives, written in place and stamped as the old one was.
	key, err := os.ReadFile(newKey)
	if err != nil || int64(len(key)) != keyInfo.Size() {
		t.Fatalf("the new key (%d bytes, %v) is not the old one's size, %d: the test needs it", len(key), err, keyInfo.Size())
	}
	if err := os.WriteFile(keyFile, key, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(keyFile, keyInfo.ModTime(), keyInfo.ModTime()); err != nil {
		t.Fatal(err)
	}
	certs.Reload()
	if got := served(); got != "new" {
		t.Fatalf("once the key arrived, handshakes see %q, want new", got)
	}
	want := `
# HELP fanwire_file_reloads_total Loads of changed files after start, by result: failed means the file did not load (half written, malformed, a key that does not match) and what was loaded before is still served; it is tried again at every check until it loads.
# TYPE fanwire_file_reloads_total counter
fanwire_file_reloads_total{file="tls_certificate",result="failed"} 2
fanwire_file_reloads_total{file="tls_certificate",result="ok"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "fanwire_file_reloads_total"); err != nil {
		t.Error(err)
	}
}

// tlsServer serves TLS with tc on a loopback listener, closing each
// connection after its handshake, until the test ends; served does a
// real handshake trusting ca and returns the certificate's common name.
func tlsServer(t *testing.T, tc *tls.Config, ca *brokertest.CA) (served func() string) {
	t.Helper()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", tc)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_ = c.(*tls.Conn).Handshake()
			_ = c.Close()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		wg.Wait()
	})
	return func() string {
		t.Helper()
		d := tls.Dialer{NetDialer: &net.Dialer{Timeout: 10 * time.Second}, Config: &tls.Config{RootCAs: ca.Pool, ServerName: "127.0.0.1"}}
		c, err := d.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		return c.(*tls.Conn).ConnectionState().PeerCertificates[0].Subject.CommonName
	}
}

// TestCertExpiryGauge: fanwire_tls_certificate_expiry_timestamp_seconds is
// the served certificate's notAfter; a scrape checks the files as a
// handshake does, so a renewal on disk shows before any client connects;
// a pair that does not load leaves the served certificate's expiry.
func TestCertExpiryGauge(t *testing.T) {
	ca := brokertest.NewCA(t)
	dir := t.TempDir()
	first := time.Now().Add(30 * 24 * time.Hour).Truncate(time.Second)
	certFile, keyFile := ca.IssueUntil(t, dir, "first", first)
	// A check at every scrape and handshake.
	certs, err := tlscert.New(certFile, keyFile, time.Nanosecond, nil)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(certs.Collector())
	expiry := func() time.Time {
		t.Helper()
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() == "fanwire_tls_certificate_expiry_timestamp_seconds" {
				return time.Unix(int64(mf.GetMetric()[0].GetGauge().GetValue()), 0)
			}
		}
		t.Fatal("no fanwire_tls_certificate_expiry_timestamp_seconds")
		return time.Time{}
	}
	if got := expiry(); !got.Equal(first) {
		t.Fatalf("expiry %v, want the certificate's notAfter %v", got, first)
	}

	renewed := first.Add(60 * 24 * time.Hour)
	newCert, newKey := ca.IssueUntil(t, t.TempDir(), "renewed", renewed)
	replace(t, newCert, certFile)
	replace(t, newKey, keyFile)
	if got := expiry(); !got.Equal(renewed) { // no handshake in between
		t.Fatalf("after a renewal, expiry %v, want %v", got, renewed)
	}
	served := tlsServer(t, certs.TLSConfig(), ca)
	if got := served(); got != "renewed" {
		t.Fatalf("handshakes see %q, want renewed", got)
	}

	_, otherKey := ca.IssueUntil(t, t.TempDir(), "other", renewed.Add(time.Hour))
	replace(t, otherKey, keyFile)
	if got := expiry(); !got.Equal(renewed) {
		t.Fatalf("with a key that does not match, expiry %v, want the served certificate's %v", got, renewed)
	}
	if got := served(); got != "renewed" {
		t.Fatalf("with a key that does not match, handshakes see %q, want renewed", got)
	}
}
