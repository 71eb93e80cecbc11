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
	"go.uber.org/zap/zaptest/observer"
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
	if !g.Allows("public.news") || g.Allows("orders.>") || g.Allows(">") || !g.Anonymous {
		t.Fatalf("grants %v: want public.> only", g.Subscribe)
	}
	open := wsFlags{allowAnonymous: true}
	if auth, err := open.authenticator(); err != nil || auth != nil {
		t.Fatalf("no grants: authenticator %v, %v; want none (every subject)", auth != nil, err)
	}
}

// startWS runs fanwire ws's serveGateway with args (and the environment)
// on a free port until the test ends; it returns its address once it
// answers /readyz.
func startWS(t *testing.T, log *zap.Logger, args ...string) string {
	t.Helper()
	listen := launchWS(t, log, args...)
	if !readyWithin(listen, 10*time.Second) {
		t.Fatal("fanwire ws not ready")
	}
	return listen
}

// launchWS is startWS without the wait (a TLS listener does not answer
// readyWithin's plain HTTP).
func launchWS(t *testing.T, log *zap.Logger, args ...string) string {
	t.Helper()
	ns := brokertest.NATS(t)
	port, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	listen := "127.0.0.1:" + strconv.Itoa(port)
	c := newCommand("ws", "")
	var f wsFlags
	f.register(c.fs, false)
	if err := c.parse(append([]string{"--listen", listen, "--nats-url", ns.ClientURL()}, args...)); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- serveGateway(ctx, log, &f, nil) }()
	t.Cleanup(func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("serveGateway: %v", err)
		}
	})
	return listen
}

// TestWSPublishIsClosedByDefault: fanwire ws without a publish credential
// logs that publishing is off and answers POST /api/publish with 403
// naming the flags; FANWIRE_ALLOW_ANONYMOUS_PUBLISH opens it, but not on
// --reserved-subjects (FANWIRE_RESERVED_SUBJECTS).
func TestWSPublishIsClosedByDefault(t *testing.T) {
	post := func(addr, subject string) (int, string) {
		t.Helper()
		resp, err := http.Post("http://"+addr+"/api/publish", "application/json", strings.NewReader(`{"subject":"`+subject+`","data":1}`))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	core, logs := observer.New(zap.InfoLevel)
	closed := startWS(t, zap.New(core), "--allow-anonymous")
	if code, body := post(closed, "demo.1"); code != http.StatusForbidden || !strings.Contains(body, "publish_disabled") || !strings.Contains(body, "--allow-anonymous-publish") || !strings.Contains(body, "--api-keys-file") {
		t.Fatalf("publish on a gateway without publish credentials: %d %s", code, body)
	}
	if logs.FilterMessageSnippet("publishing is off").Len() != 1 {
		t.Fatalf("no start-up log line says publishing is off: %v", logs.All())
	}

	t.Setenv("FANWIRE_ALLOW_ANONYMOUS_PUBLISH", "true")
	t.Setenv("FANWIRE_RESERVED_SUBJECTS", "db.>,internal.>")
	open := startWS(t, zap.NewNop(), "--allow-anonymous")
	if code, body := post(open, "demo.1"); code != http.StatusOK {
		t.Fatalf("anonymous publish allowed: %d %s", code, body)
	}
	for _, s := range []string{"db.orders.1", "internal.x"} {
		if code, body := post(open, s); code != http.StatusForbidden || !strings.Contains(body, "reserved_subjects") {
			t.Fatalf("anonymous publish on %s: %d %s, want 403 reserved_subjects", s, code, body)
		}
	}
}
