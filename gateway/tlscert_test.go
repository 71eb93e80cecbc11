package gateway_test

import (
	"context"
	"crypto/tls"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/fanwire/fanwire/broker"
	"github.com/fanwire/fanwire/broker/brokertest"
	"github.com/fanwire/fanwire/gateway"
	"github.com/fanwire/fanwire/gateway/gatewaytest"
	"github.com/fanwire/fanwire/gateway/tlscert"
	"github.com/prometheus/client_golang/prometheus"
)

// TestTLSListenerReloadsItsCertificate: a wss:// client trusting the test's
// CA gets events from a gateway serving CertFiles; when the files are
// replaced, a new connection sees the new certificate; a pair that does
// not load leaves the last good one in place.
func TestTLSListenerReloadsItsCertificate(t *testing.T) {
	ca := brokertest.NewCA(t)
	dir := t.TempDir()
	certFile, keyFile := ca.Issue(t, dir, "gateway")
	certs, err := tlscert.New(certFile, keyFile, 20*time.Millisecond, nil)
	if err != nil {
		t.Fatal(err)
	}
	ns := brokertest.NATS(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	b, err := broker.DialNATS(ctx, broker.NATSConfig{URL: ns.ClientURL()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.Pool}, DisableKeepAlives: true}}
	gs := gatewaytest.StartTLS(t, gateway.Config{Broker: b, Registry: prometheus.NewRegistry()}, certs.TLSConfig(), client)
	if !strings.HasPrefix(gs.WSURL(), "wss://") {
		t.Fatalf("WSURL %s", gs.WSURL())
	}

	// dial connects over wss:// and says which certificate it was shown.
	dial := func() (*websocket.Conn, string) {
		t.Helper()
		c, resp, err := websocket.Dial(ctx, gs.WSURL(), &websocket.DialOptions{HTTPClient: client})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.CloseNow() })
		if resp.TLS == nil || len(resp.TLS.PeerCertificates) == 0 {
			t.Fatal("no TLS state on the upgrade response")
		}
		return c, resp.TLS.PeerCertificates[0].Subject.CommonName
	}
	c, name := dial()
	if name != "gateway" {
		t.Fatalf("certificate %q, want gateway", name)
	}
	if err := c.Write(ctx, websocket.MessageText, []byte(`{"type":"subscribe","id":"s","subject":"app.>"}`)); err != nil {
		t.Fatal(err)
	}
	readUntil(t, ctx, c, `"subscribed"`)
	if _, err := b.Publish(ctx, []broker.Outgoing{{Subject: "app.tls", Data: []byte(`"over wss"`)}}); err != nil {
		t.Fatal(err)
	}
	readUntil(t, ctx, c, `over wss`)

	// Renewed: the same paths hold a new certificate.
	renewed, renewedKey := ca.Issue(t, t.TempDir(), "gateway-renewed")
	replace(t, renewed, certFile)
	replace(t, renewedKey, keyFile)
	waitForCert := func(want string) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			c, name := dial()
			c.CloseNow()
			if name == want {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("new connections still see %q, want %q", name, want)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitForCert("gateway-renewed")
	// The first connection still works on the certificate it was shown.
	if _, err := b.Publish(ctx, []broker.Outgoing{{Subject: "app.tls", Data: []byte(`"still here"`)}}); err != nil {
		t.Fatal(err)
	}
	readUntil(t, ctx, c, `still here`)

	// A key that does not match the certificate: the renewed one stays.
	_, otherKey := ca.Issue(t, t.TempDir(), "other")
	replace(t, otherKey, keyFile)
	// Connections over five check intervals (the bad pair is tried within
	// the first) all see the renewed certificate.
	for end := time.Now().Add(100 * time.Millisecond); time.Now().Before(end); {
		c, name := dial()
		c.CloseNow()
		if name != "gateway-renewed" {
			t.Fatalf("after a bad pair new connections see %q, want gateway-renewed", name)
		}
	}
	// Fixed: the matching key arrives, the next certificate is served.
	next, nextKey := ca.Issue(t, t.TempDir(), "gateway-next")
	replace(t, next, certFile)
	replace(t, nextKey, keyFile)
	waitForCert("gateway-next")
}

// TestCertFilesErrorsNameTheFiles: NewCertFiles fails on a missing file or
// a key that does not match, naming the files.
func TestCertFilesErrorsNameTheFiles(t *testing.T) {
	ca := brokertest.NewCA(t)
	dir := t.TempDir()
	cert, _ := ca.Issue(t, dir, "a")
	_, otherKey := ca.Issue(t, dir, "b")
	missing := filepath.Join(dir, "missing.pem")
	for _, tc := range []struct{ cert, key, want string }{
		{missing, otherKey, missing},
		{cert, missing, missing},
		{cert, otherKey, otherKey},
	} {
		if _, err := tlscert.New(tc.cert, tc.key, 0, nil); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("NewCertFiles(%s, %s): %v, want an error naming %s", tc.cert, tc.key, err, tc.want)
		}
	}
}

// replace moves src over dst, as a certificate renewal does.
func replace(t *testing.T, src, dst string) {
	t.Helper()
	if err := os.Rename(src, dst); err != nil {
		t.Fatal(err)
	}
}

// readUntil reads messages until one contains want.
func readUntil(t *testing.T, ctx context.Context, c *websocket.Conn, want string) {
	t.Helper()
	for {
		_, msg, err := c.Read(ctx)
		if err != nil {
			t.Fatalf("reading for %s: %v", want, err)
		}
		if strings.Contains(string(msg), want) {
			return
		}
	}
}
