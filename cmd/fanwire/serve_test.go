package main

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fanwire/fanwire/broker/brokertest"
	"go.uber.org/zap"
)

// TestHandshakeTimeoutReachesTheServer: FANWIRE_HANDSHAKE_TIMEOUT (like
// --handshake-timeout) sets the timeout of the http.Server fanwire ws
// serves with: a connection that sends nothing is closed after it, with no
// answer, and counted in /metrics.
func TestHandshakeTimeoutReachesTheServer(t *testing.T) {
	ns := brokertest.NATS(t)
	port, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	listen := "127.0.0.1:" + strconv.Itoa(port)
	t.Setenv("FANWIRE_HANDSHAKE_TIMEOUT", "300ms")
	c := newCommand("ws", "")
	var f wsFlags
	f.register(c.fs, false)
	if err := c.parse([]string{"--listen", listen, "--nats-url", ns.ClientURL(), "--allow-anonymous"}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- serveGateway(ctx, zap.NewNop(), &f, nil) }()
	t.Cleanup(func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("serveGateway: %v", err)
		}
	})
	if !readyWithin(listen, 10*time.Second) {
		t.Fatal("fanwire ws not ready")
	}

	conn, err := net.DialTimeout("tcp", listen, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	start := time.Now()
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	got, err := io.ReadAll(conn)
	if err != nil || len(got) != 0 {
		t.Fatalf("silent connection: read %q, %v; want a close without an answer", got, err)
	}
	// Well under the 10 s default: the variable took effect.
	if d := time.Since(start); d < 250*time.Millisecond || d > 5*time.Second {
		t.Fatalf("silent connection closed after %v, want about 300ms", d)
	}
	// net/http runs its close hook (which counts) just after the close the
	// client saw: poll.
	want := `fanwire_connections_rejected_total{reason="handshake_timeout"} 1`
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		resp, err := http.Get("http://" + listen + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if strings.Contains(string(body), want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("/metrics lacks %s", want)
		}
	}
}

// TestAnonymousGrantsWithoutAKey: without a JWT key, --allow-anonymous
// admits every connection; with --anonymous-grants they may subscribe only
// inside those patterns, without them to anything.
func TestAnonymousGrantsWithoutAKey(t *testing.T) {
	f := wsFlags{allowAnonymous: true, anonymousGrants: listFlag{"public.>"}}
	auth, err := f.authenticator()
	if err != nil || auth == nil {
		t.Fatalf("authenticator: %v, %v; want one granting public.>", auth, err)
	}
	g, err := auth(context.Background(), httptest.NewRequest("GET", "/ws", nil), nil)
	if err != nil {
		t.Fatal(err)
	}
	if !g.Allows("public.news") || g.Allows("orders.>") || g.Allows(">") {
		t.Fatalf("grants %v: want public.> only", g.Subscribe)
	}
	open := wsFlags{allowAnonymous: true}
	if auth, err := open.authenticator(); err != nil || auth != nil {
		t.Fatalf("no grants: authenticator %v, %v; want none (every subject)", auth != nil, err)
	}
}
