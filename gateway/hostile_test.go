package gateway_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/fanwire/fanwire/gateway"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// The hostile-client suite: real TCP and WebSocket clients that misbehave
// against a real gateway on a real broker, served through the same
// http.Server as fanwire ws (gatewaytest serves gateway.HTTPServer). While
// they do, well-behaved clients on the same server receive a numbered
// stream, and at the end each must have every event exactly once, in order.
// After every abuse the process's goroutines return to their baseline and
// its heap stays within a generous bound: these are leak checks, not
// performance targets.

const (
	hostileHandshake = 300 * time.Millisecond
	hostileHeapBound = 64 << 20
	goroutineMargin  = 10
)

func TestHostileClients(t *testing.T) {
	if testing.Short() {
		t.Skip("-short (make test-quick) leaves out the slow tests: make test runs them")
	}
	raiseFDLimit(t, 6000)
	// The server's logs, net/http's included (a panic in a handler is
	// recovered and logged there): none may report one.
	logCore, logs := observer.New(zap.DebugLevel)
	e := newEnv(t, func(c *gateway.Config) {
		c.Logger = zap.New(logCore)
		c.HandshakeTimeout = hostileHandshake
		c.PingInterval = 2 * time.Second
		c.PingTimeout = 2 * time.Second
		c.CloseTimeout = time.Second
		c.MaxSubscriptions = 32
		c.GraphQLInitTimeout = 500 * time.Millisecond
		c.AllowAnonymousPublish = true // the slow-body abuse publishes without a key
	})
	feed := startFeed(t, e, 4, "feed.seq")
	base := measureFootprint()
	t.Logf("baseline: %d goroutines, heap %.1f MiB", base.goroutines, float64(base.heap)/(1<<20))

	// Each abuse runs against the same server while the feed flows; each
	// must leave the process where it found it.
	for _, sc := range []struct {
		name string
		run  func(t *testing.T, e *env)
	}{
		{"connects without upgrade", abuseConnectsWithoutUpgrade},
		{"slowloris headers", abuseSlowloris},
		{"oversized headers", abuseOversizedHeaders},
		{"slow request bodies", abuseSlowBody},
		{"silent after upgrade", abuseSilentAfterUpgrade},
		{"half-open, never reading", abuseHalfOpen},
		{"1 MiB frames", abuseHugeFrames},
		{"invalid UTF-8", abuseInvalidUTF8},
		{"binary frames", abuseBinaryFrames},
		{"ping floods", abusePingFlood},
		{"subscribe/unsubscribe storms", abuseSubscriptionStorm},
		{"GraphQL: no init, garbage, ping flood", abuseGraphQL},
	} {
		t.Run(sc.name, func(t *testing.T) {
			paced0 := e.metric("fanwire_dispatch_paced_seconds_total", nil)
			feed.resetGaps()
			sc.run(t, e)
			// Reported, not asserted: how the abuse slowed the feed.
			t.Logf("good clients' longest wait between two events: %v; dispatcher paced for %.3fs",
				feed.maxGap().Round(time.Millisecond), e.metric("fanwire_dispatch_paced_seconds_total", nil)-paced0)
			checkFootprint(t, base)
		})
		if t.Failed() {
			break
		}
	}
	feed.finish(t, e)
	for _, l := range logs.All() {
		if strings.Contains(l.Message, "panic") {
			t.Errorf("server log: %s %v", l.Message, l.ContextMap())
		}
	}
}

// abuseConnectsWithoutUpgrade: 2,000 connections that never upgrade. Those
// that send nothing, or half a request, are closed at the handshake timeout
// without an answer; a plain GET gets 426 and is closed at once.
func abuseConnectsWithoutUpgrade(t *testing.T, e *env) {
	const silent, partial, plain = 1000, 500, 500
	timeouts0 := e.metric("fanwire_connections_rejected_total", map[string]string{"reason": "handshake_timeout"})
	bad0 := e.metric("fanwire_connections_rejected_total", map[string]string{"reason": "bad_upgrade"})
	conns0 := e.metric("fanwire_connections", nil)
	addr := e.http.Listener.Addr().String()
	type probe struct {
		c    net.Conn
		kind string
	}
	probes := make([]probe, 0, silent+partial+plain)
	defer func() {
		for _, p := range probes {
			p.c.Close()
		}
	}()
	start := time.Now()
	for i := range silent + partial + plain {
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			t.Fatalf("dial %d: %v", i, err)
		}
		p := probe{c: c, kind: "silent"}
		switch {
		case i%4 == 1:
			p.kind = "partial"
			_, err = io.WriteString(c, "GET /ws HTTP/1.1\r\nHost: "+addr+"\r\nUpgrade: websocket\r\n")
		case i%4 == 3:
			p.kind = "plain"
			_, err = io.WriteString(c, "GET /ws HTTP/1.1\r\nHost: "+addr+"\r\n\r\n")
		}
		if err != nil {
			t.Fatalf("write %d: %v", i, err)
		}
		probes = append(probes, p)
	}
	dialed := time.Since(start)
	for _, p := range probes {
		_ = p.c.SetReadDeadline(time.Now().Add(15 * time.Second))
		got, err := io.ReadAll(p.c)
		if err != nil && !errors.Is(err, syscall.ECONNRESET) {
			t.Fatalf("%s connection not closed by the server: %v", p.kind, err)
		}
		switch p.kind {
		case "plain":
			if !bytes.HasPrefix(got, []byte("HTTP/1.1 426 ")) || !bytes.Contains(got, []byte("bad_upgrade")) {
				t.Fatalf("plain GET /ws: got %q, want 426 naming bad_upgrade", got)
			}
		default:
			if len(got) != 0 {
				t.Fatalf("%s connection: got %q, want a close without an answer", p.kind, got)
			}
		}
	}
	t.Logf("%d connections dialed in %v, all closed by the server %v after the first dial", len(probes), dialed.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
	waitCounted(t, e, "handshake timeouts counted", func() bool {
		return e.metric("fanwire_connections_rejected_total", map[string]string{"reason": "handshake_timeout"})-timeouts0 == silent+partial
	})
	if n := e.metric("fanwire_connections_rejected_total", map[string]string{"reason": "bad_upgrade"}) - bad0; n != plain {
		t.Fatalf("bad_upgrade counted %v times, want %d", n, plain)
	}
	if n := e.metric("fanwire_connections", nil); n != conns0 {
		t.Fatalf("fanwire_connections %v, want %v: no probe is a WebSocket", n, conns0)
	}
	waitCounted(t, e, "handshake tracking to forget the closed connections", func() bool {
		return gateway.PendingHandshakes(e.srv) == 0
	})
}

// abuseSlowloris: request headers trickling in at one byte per 100 ms are
// cut at the handshake timeout, however long the trickle would go on
// (net/http closes without an answer, or with a 400 when the timeout
// strikes mid-header).
func abuseSlowloris(t *testing.T, e *env) {
	const n = 20
	timeouts0 := e.metric("fanwire_connections_rejected_total", map[string]string{"reason": "handshake_timeout"})
	addr := e.http.Listener.Addr().String()
	req := []byte("GET /ws HTTP/1.1\r\nHost: " + addr + "\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nX-Slow: " + strings.Repeat("a", 200))
	conns := make([]net.Conn, n)
	open := make([]bool, n)
	for i := range conns {
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		conns[i], open[i] = c, true
	}
	start := time.Now()
	left := n
	var sent int
	buf := make([]byte, 64)
	for pos := 0; left > 0 && pos < len(req); pos++ { // 20 s of trickle at most
		for i, c := range conns {
			if !open[i] {
				continue
			}
			if _, err := c.Write(req[pos : pos+1]); err != nil {
				open[i] = false
				left--
				continue
			}
			sent++
			// Has the server closed it? A read that finds nothing within
			// a millisecond says no.
			_ = c.SetReadDeadline(time.Now().Add(time.Millisecond))
			if k, err := c.Read(buf); err != nil {
				var ne net.Error
				if !(errors.As(err, &ne) && ne.Timeout()) {
					open[i] = false
					left--
				}
			} else if k > 0 {
				// net/http may answer a request cut mid-header with a 400
				// (and close): see that it does both.
				_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
				rest, err := io.ReadAll(c)
				if errors.Is(err, syscall.ECONNRESET) { // it had unread bytes of ours
					err = nil
				}
				if got := append(buf[:k:k], rest...); err != nil || !bytes.HasPrefix(got, []byte("HTTP/1.1 400 ")) {
					t.Fatalf("slowloris connection got %q, %v; want no answer, or a 400, and a close", got, err)
				}
				open[i] = false
				left--
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	if left > 0 {
		t.Fatalf("%d of %d slowloris connections still open after %v", left, n, time.Since(start))
	}
	t.Logf("%d slowloris connections closed within %v (%d header bytes sent in all)", n, time.Since(start).Round(time.Millisecond), sent)
	waitCounted(t, e, "slowloris handshake timeouts counted", func() bool {
		return e.metric("fanwire_connections_rejected_total", map[string]string{"reason": "handshake_timeout"})-timeouts0 == n
	})
}

// abuseOversizedHeaders: an upgrade request with 100 KiB of headers is
// over the server's 64 KiB: 431, and the connection is closed.
func abuseOversizedHeaders(t *testing.T, e *env) {
	addr := e.http.Listener.Addr().String()
	req := "GET /ws HTTP/1.1\r\nHost: " + addr + "\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n" +
		"X-Big: " + strings.Repeat("b", 100<<10) + "\r\n\r\n"
	for range 5 {
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if _, err := io.WriteString(c, req); err != nil {
			t.Fatal(err)
		}
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		got, err := io.ReadAll(c)
		if err != nil && !errors.Is(err, syscall.ECONNRESET) {
			t.Fatalf("oversized headers: connection not closed: %v", err)
		}
		if !bytes.HasPrefix(got, []byte("HTTP/1.1 431 ")) {
			t.Fatalf("oversized headers: got %q, want 431", got)
		}
	}
}

// abuseSlowBody: a POST whose body trickles in (one byte per 100 ms) gets
// the handshake timeout for it as well: a publish is answered 408 and
// counted; a GraphQL query is answered too. Neither holds its connection.
// A publish whose body arrives in time still works on the same server.
func abuseSlowBody(t *testing.T, e *env) {
	timeouts0 := e.metric("fanwire_publish_requests_total", map[string]string{"result": "body_timeout"})
	addr := e.http.Listener.Addr().String()
	for _, path := range []string{"/api/publish", "/api/publish", "/graphql"} {
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		body := `{"subject":"slow.x","data":"` + strings.Repeat("s", 200) + `"}`
		if path == "/graphql" {
			body = `{"query":"{ health { status } }","pad":"` + strings.Repeat("s", 200) + `"}`
		}
		head := "POST " + path + " HTTP/1.1\r\nHost: " + addr + "\r\nContent-Type: application/json\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n"
		if _, err := io.WriteString(c, head); err != nil {
			t.Fatal(err)
		}
		answered := make(chan []byte, 1)
		var wg sync.WaitGroup
		wg.Add(1)
		go func() { // reads the answer while the body trickles
			defer wg.Done()
			_ = c.SetReadDeadline(time.Now().Add(15 * time.Second))
			got, _ := io.ReadAll(c) // a reset after the answer is fine
			answered <- got
		}()
		var got []byte
	trickle:
		for i := range len(body) {
			select {
			case got = <-answered:
				break trickle
			case <-time.After(100 * time.Millisecond):
			}
			if _, err := c.Write([]byte{body[i]}); err != nil {
				break
			}
		}
		if got == nil {
			got = <-answered
		}
		wg.Wait()
		want := "HTTP/1.1 408 "
		if path == "/graphql" {
			want = "HTTP/1.1 " // gqlgen's answer to a failed read
		}
		if !bytes.HasPrefix(got, []byte(want)) {
			t.Fatalf("POST %s with a trickling body: got %q, want %q…", path, got, want)
		}
		status, _, _ := bytes.Cut(got, []byte("\r\n"))
		t.Logf("POST %s with a trickling body: %s", path, status)
	}
	if got := e.metric("fanwire_publish_requests_total", map[string]string{"result": "body_timeout"}) - timeouts0; got != 2 {
		t.Fatalf("body_timeout counted %v times, want 2", got)
	}
	resp, err := http.Post(e.http.URL+"/api/publish", "application/json", strings.NewReader(`{"subject":"slow.x","data":1}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("a timely publish after the slow ones: %s", resp.Status)
	}
}

// abuseSilentAfterUpgrade: connections that upgrade and then neither send
// nor read anything are idle connections with a dead peer: the server's
// ping goes unanswered and PingTimeout closes them.
func abuseSilentAfterUpgrade(t *testing.T, e *env) {
	const n = 50
	pings0 := e.metric("fanwire_disconnects_total", map[string]string{"reason": "ping_timeout"})
	conns0 := e.metric("fanwire_connections", nil)
	for range n {
		c := upgradeRaw(t, e, 0)
		defer c.Close()
	}
	waitCounted(t, e, "silent connections closed by the ping timeout", func() bool {
		return e.metric("fanwire_disconnects_total", map[string]string{"reason": "ping_timeout"})-pings0 == n
	})
	if got := e.metric("fanwire_connections", nil); got != conns0 {
		t.Fatalf("fanwire_connections %v, want %v", got, conns0)
	}
}

// abuseHalfOpen: connections that subscribe and then stop reading (tiny
// receive buffers, so the kernel's buffers fill fast) while big events
// flow. Each is cut: as a slow consumer (4008 requested, and since its
// writer is stuck in a write, the socket is cut after CloseTimeout), or,
// when its ping came first, for the unanswered ping: which one comes
// first is the machine's pace, not the server's choice, so both count.
// The feed goes on. The events are big (256 KiB), so that few batches
// fill the mailboxes: while most mailboxes are over half full the
// dispatcher paces each batch (MaxPace).
func abuseHalfOpen(t *testing.T, e *env) {
	const n, events, size = 20, 2000, 256 << 10
	disc := func(reason string) float64 {
		return e.metric("fanwire_disconnects_total", map[string]string{"reason": reason})
	}
	slow0, ping0 := disc("slow_consumer"), disc("ping_timeout")
	subs0 := e.metric("fanwire_subscriptions", nil)
	for i := range n {
		c := upgradeRaw(t, e, 4096)
		defer c.Close()
		c.send(t, websocket.MessageText, `{"type":"subscribe","id":"h`+strconv.Itoa(i)+`","subject":"bulk.x"}`)
	}
	waitCounted(t, e, "half-open clients subscribed", func() bool {
		return e.metric("fanwire_subscriptions", nil)-subs0 == n
	})
	// Published until every one of them is gone, whatever the kernel's
	// buffers let through: the condition waited for is the verdicts, not
	// a volume. Each block of 50 is followed by a marker on the same NATS
	// connection, which the gateway's one subscription receives after the
	// block: when a client has the marker, the block has been dispatched.
	// The flood goes at the gateway's pace (one faster than it reads is
	// dropped by NATS before it reaches any mailbox), and when the loop
	// ends none of it is still in flight to be counted in the heap: the
	// gateway's counters would not tell that, as the feed's events count
	// in them too.
	mark := e.dial()
	mark.subscribe("m", "bulk.mark")
	pad := strings.Repeat("x", size)
	gone := func() float64 { return disc("slow_consumer") - slow0 + disc("ping_timeout") - ping0 }
	for i := 0; i%50 != 0 || gone() < n; i++ {
		if i == 50*events {
			t.Fatalf("%d events of %d KiB published, and %v of %d half-open clients cut (%v as slow consumers)", i, size>>10, gone(), n, disc("slow_consumer")-slow0)
		}
		if err := e.nc.Publish("bulk.x", []byte(`{"i":`+strconv.Itoa(i)+`,"pad":"`+pad+`"}`)); err != nil {
			t.Fatal(err)
		}
		if i%50 == 49 {
			e.publish("bulk.mark", `{"i":`+strconv.Itoa(i)+`}`)
			if m := mark.nextWithin(time.Minute); m["type"] != "event" || !jsonEqual(m["data"], map[string]any{"i": i}) {
				t.Fatalf("got %v, want the marker after event %d", m, i)
			}
		}
	}
	if got := gone(); got != n {
		t.Fatalf("%v half-open clients cut, want %d", got, n)
	}
	t.Logf("%v cut as slow consumers, %v for their unanswered ping", disc("slow_consumer")-slow0, disc("ping_timeout")-ping0)
	waitCounted(t, e, "half-open subscriptions gone", func() bool { return e.metric("fanwire_subscriptions", nil) == subs0 })
}

// abuseHugeFrames: 1 MiB messages, in one frame or in 32 KiB fragments, are
// over the read limit (64 KiB): close 1009, counted as read_limit.
func abuseHugeFrames(t *testing.T, e *env) {
	const n = 10
	limit0 := e.metric("fanwire_disconnects_total", map[string]string{"reason": "read_limit"})
	payload := bytes.Repeat([]byte("a"), 1<<20)
	var wg sync.WaitGroup
	defer wg.Wait()
	for i := range n {
		c := upgradeRaw(t, e, 0)
		defer c.Close()
		fragmented := i%2 == 1
		wg.Add(1)
		go func() { // the server stops reading: this write may block until the socket is closed
			defer wg.Done()
			if !fragmented {
				_ = c.writeFrame(true, opText, payload)
				return
			}
			const part = 32 << 10
			for off := 0; off < len(payload); off += part {
				op := byte(opContinuation)
				if off == 0 {
					op = opText
				}
				if c.writeFrame(off+part >= len(payload), op, payload[off:off+part]) != nil {
					return
				}
			}
		}()
		if code, _ := c.closeCode(t, 10*time.Second); code != websocket.StatusMessageTooBig {
			t.Fatalf("1 MiB message (fragmented: %v): close %v, want 1009", fragmented, code)
		}
		c.Close()
	}
	waitCounted(t, e, "read_limit counted", func() bool {
		return e.metric("fanwire_disconnects_total", map[string]string{"reason": "read_limit"})-limit0 == n
	})
}

// abuseInvalidUTF8: a text message that is not UTF-8 fails the connection
// with 1007 (RFC 6455 §8.1) and is not acted on; UTF-8 split across
// fragments is a valid message.
func abuseInvalidUTF8(t *testing.T, e *env) {
	const n = 5
	bad0 := e.metric("fanwire_disconnects_total", map[string]string{"reason": "invalid_utf8"})
	subs0 := e.metric("fanwire_subscriptions", nil)
	for range n {
		c := upgradeRaw(t, e, 0)
		defer c.Close()
		c.send(t, websocket.MessageText, "{\"type\":\"subscribe\",\"id\":\"\xff\xfe\",\"subject\":\"feed.seq\"}")
		code, _ := c.closeCode(t, 10*time.Second)
		if code != websocket.StatusInvalidFramePayloadData {
			t.Fatalf("invalid UTF-8: close %v, want 1007", code)
		}
	}
	waitCounted(t, e, "invalid_utf8 counted", func() bool {
		return e.metric("fanwire_disconnects_total", map[string]string{"reason": "invalid_utf8"})-bad0 == n
	})
	if got := e.metric("fanwire_subscriptions", nil); got != subs0 {
		t.Fatalf("fanwire_subscriptions %v, want %v: an invalid message was acted on", got, subs0)
	}

	// "é" is 0xc3 0xa9: each fragment alone is not UTF-8, the message is.
	c := upgradeRaw(t, e, 0)
	defer c.Close()
	msg := []byte(`{"type":"subscribe","id":"é","subject":"utf8.quiet"}`) // no events: replies only
	cut := bytes.IndexByte(msg, 0xc3) + 1
	if err := c.writeFrame(false, opText, msg[:cut]); err != nil {
		t.Fatal(err)
	}
	if err := c.writeFrame(true, opContinuation, msg[cut:]); err != nil {
		t.Fatal(err)
	}
	c.expectText(t, `{"type":"subscribed","id":"é"`)
	c.send(t, websocket.MessageText, `{"type":"unsubscribe","id":"é"}`)
	c.expectText(t, `{"type":"unsubscribed","id":"é"}`)
	c.closeNormally(t)
}

// abuseBinaryFrames: a binary frame gets the documented error (bad_frame)
// and the connection stays; a flood of them is repeated abuse: 1008 after
// MaxClientErrors (100) errors.
func abuseBinaryFrames(t *testing.T, e *env) {
	bad0 := e.metric("fanwire_client_errors_total", map[string]string{"code": "bad_frame"})
	policy0 := e.metric("fanwire_disconnects_total", map[string]string{"reason": "policy"})
	c := upgradeRaw(t, e, 0)
	defer c.Close()
	c.send(t, websocket.MessageBinary, `{"type":"ping"}`)
	c.expectText(t, `{"type":"error","code":"bad_frame","message":"binary frames are not supported`)
	c.send(t, websocket.MessageText, `{"type":"ping"}`)
	c.expectText(t, `{"type":"pong"}`)
	for range 150 {
		if err := c.writeFrame(true, opBinary, []byte{0, 1, 2, 3}); err != nil {
			break // the server closed
		}
	}
	code, texts := c.closeCode(t, 10*time.Second)
	if code != websocket.StatusPolicyViolation {
		t.Fatalf("binary flood: close %v, want 1008", code)
	}
	// The 101st error (the flood's 100th) asks for the close; what
	// follows is not acted on.
	if len(texts) != 100 {
		t.Fatalf("binary flood: %d replies before the close, want 100", len(texts))
	}
	if got := e.metric("fanwire_client_errors_total", map[string]string{"code": "bad_frame"}) - bad0; got != 101 {
		t.Fatalf("bad_frame counted %v times, want 101", got)
	}
	waitCounted(t, e, "policy disconnect counted", func() bool {
		return e.metric("fanwire_disconnects_total", map[string]string{"reason": "policy"})-policy0 == 1
	})
}

// abusePingFlood: WebSocket pings by the thousand. A ping is a client
// message: within the message rate (100/s, burst 200) each gets its pong,
// past it none does and each counts as rate_limited, and those errors close
// the connection with 1008 like any flood. A flooder that reads nothing
// meets the same end: the flood never costs the server a write per ping.
func abusePingFlood(t *testing.T, e *env) {
	const pings = 20000
	limited0 := e.metric("fanwire_client_errors_total", map[string]string{"code": "rate_limited"})
	policy0 := e.metric("fanwire_disconnects_total", map[string]string{"reason": "policy"})
	payload := []byte("flood-0123456789")

	c := upgradeRaw(t, e, 0)
	defer c.Close()
	c.expectText(t, `{"type":"ready"`)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer c.Close() // before the wait: ends a flood stuck in a write
	wg.Add(1)
	go func() { // the flood; the test goroutine reads meanwhile
		defer wg.Done()
		for range pings {
			if c.writeFrame(true, opPing, payload) != nil {
				return // the server closed
			}
		}
	}()
	pongs := 0
	_ = c.c.SetReadDeadline(time.Now().Add(20 * time.Second))
	var code websocket.StatusCode
	for code == 0 {
		op, p, err := c.next()
		if err != nil {
			t.Fatalf("ping flood: %d pongs, then %v", pongs, err)
		}
		switch op {
		case opPong:
			pongs++
		case opClose:
			code = websocket.StatusCode(binary.BigEndian.Uint16(p))
			_ = c.writeFrame(true, opClose, p[:2])
		}
	}
	if code != websocket.StatusPolicyViolation {
		t.Fatalf("ping flood: close %v, want 1008", code)
	}
	if pongs < 200 || pongs > 400 { // the burst, and what the rate refilled meanwhile
		t.Fatalf("ping flood: %d pongs, want the burst of 200 and a few more", pongs)
	}

	// A flooder that reads nothing: its socket is closed under it.
	d := upgradeRaw(t, e, 4096)
	defer d.Close()
	_ = d.c.SetWriteDeadline(time.Now().Add(20 * time.Second))
	// Until the server closes the socket: how many pings get out first
	// depends on how soon the server reads them (a loaded machine reads
	// late), so the bound is time, not a count.
	sent := 0
	var werr error
	for start := time.Now(); werr == nil && time.Since(start) < 20*time.Second; sent++ {
		werr = d.writeFrame(true, opPing, payload)
	}
	var ne net.Error
	switch {
	case werr == nil:
		t.Fatalf("a client that reads nothing sent pings for 20 s (%d) and its socket is still open", sent)
	case errors.As(werr, &ne) && ne.Timeout():
		t.Fatalf("after %d pings the socket is stuck, not closed by the server", sent)
	}
	waitCounted(t, e, "both flooders closed with 1008", func() bool {
		return e.metric("fanwire_disconnects_total", map[string]string{"reason": "policy"})-policy0 == 2
	})
	if got := e.metric("fanwire_client_errors_total", map[string]string{"code": "rate_limited"}) - limited0; got < 2*100 {
		t.Fatalf("rate_limited counted %v times, want at least 100 per flooder", got)
	}
	t.Logf("ping flood: %d of %d pings answered before the 1008; the non-reading flooder got %d pings out before its socket was closed", pongs, pings, sent)
}

// abuseSubscriptionStorm: subscribe/unsubscribe as fast as the socket
// goes. Past the subscription cap: too_many_subscriptions; past the message
// rate: rate_limited, and those errors soon close the connection with 1008.
// Afterwards the subscription index is as it was: nothing leaked.
func abuseSubscriptionStorm(t *testing.T, e *env) {
	const n, capSubs = 10, 32
	tooMany0 := e.metric("fanwire_client_errors_total", map[string]string{"code": "too_many_subscriptions"})
	limited0 := e.metric("fanwire_client_errors_total", map[string]string{"code": "rate_limited"})
	policy0 := e.metric("fanwire_disconnects_total", map[string]string{"reason": "policy"})
	subs0 := e.metric("fanwire_subscriptions", nil)
	idx0, nodes0 := gateway.IndexSize(e.srv)
	var storm bytes.Buffer
	for k := range n {
		c := upgradeRaw(t, e, 0)
		defer c.Close()
		storm.Reset()
		for i := range capSubs + 8 { // 8 over the cap
			c.appendFrame(&storm, true, opText, []byte(fmt.Sprintf(`{"type":"subscribe","id":"s%d","subject":"storm.%d.%d"}`, i, k, i)))
		}
		for i := range 2500 {
			c.appendFrame(&storm, true, opText, []byte(fmt.Sprintf(`{"type":"unsubscribe","id":"s%d"}`, i%capSubs)))
			c.appendFrame(&storm, true, opText, []byte(fmt.Sprintf(`{"type":"subscribe","id":"s%d","subject":"storm.%d.x.%d"}`, i%capSubs, k, i)))
		}
		// Written by another goroutine: the server stops reading once the
		// connection closes, and the rest may not fit in the socket.
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _ = c.c.Write(storm.Bytes())
		}()
		code, _ := c.closeCode(t, 10*time.Second)
		c.Close()
		wg.Wait()
		if code != websocket.StatusPolicyViolation {
			t.Fatalf("storm %d: close %v, want 1008", k, code)
		}
	}
	waitCounted(t, e, "storm connections closed with 1008", func() bool {
		return e.metric("fanwire_disconnects_total", map[string]string{"reason": "policy"})-policy0 == n
	})
	if got := e.metric("fanwire_client_errors_total", map[string]string{"code": "too_many_subscriptions"}) - tooMany0; got < n*8 {
		t.Fatalf("too_many_subscriptions counted %v times, want at least %d", got, n*8)
	}
	if got := e.metric("fanwire_client_errors_total", map[string]string{"code": "rate_limited"}) - limited0; got < n {
		t.Fatalf("rate_limited counted %v times, want at least %d", got, n)
	}
	waitCounted(t, e, "storm subscriptions gone", func() bool { return e.metric("fanwire_subscriptions", nil) == subs0 })
	if idx, nodes := gateway.IndexSize(e.srv); idx != idx0 || nodes != nodes0 {
		t.Fatalf("index after the storms: %d subscriptions in %d nodes, want %d in %d", idx, nodes, idx0, nodes0)
	}
}

// abuseGraphQL: on /graphql, a connection that never sends
// connection_init is closed with 4408 (its handshake timeout), garbage gets
// 4400, and a flood (of WebSocket pings here) 1008 at once: the protocol
// has no error without an operation.
func abuseGraphQL(t *testing.T, e *env) {
	reason := func(r string) float64 {
		return e.metric("fanwire_disconnects_total", map[string]string{"reason": r})
	}
	init0, proto0, policy0 := reason("init_timeout"), reason("protocol_error"), reason("policy")

	// No subprotocol: 4406, whatever the client sends meanwhile (a ping
	// arrives while the server waits for the close handshake).
	noProto := upgradeRawTo(t, e, "/graphql", "", 0)
	defer noProto.Close()
	if err := noProto.writeFrame(true, opPing, []byte("early")); err != nil {
		t.Fatal(err)
	}
	if code, _ := noProto.closeCode(t, 10*time.Second); code != gateway.CloseSubprotocol {
		t.Fatalf("GraphQL without a subprotocol: close %v, want 4406", code)
	}

	silent := upgradeRawTo(t, e, "/graphql", "graphql-transport-ws", 0)
	defer silent.Close()
	if code, _ := silent.closeCode(t, 10*time.Second); code != gateway.CloseInitTimeout {
		t.Fatalf("GraphQL without connection_init: close %v, want 4408", code)
	}

	garbage := upgradeRawTo(t, e, "/graphql", "graphql-transport-ws", 0)
	defer garbage.Close()
	garbage.send(t, websocket.MessageText, `{"type":"connection_init"}`)
	garbage.expectText(t, `{"type":"connection_ack"`)
	garbage.send(t, websocket.MessageText, `{"type":"subscribe","id":"1","payload":{"query":`)
	if code, _ := garbage.closeCode(t, 10*time.Second); code != gateway.CloseBadRequest {
		t.Fatalf("GraphQL garbage: close %v, want 4400", code)
	}

	flood := upgradeRawTo(t, e, "/graphql", "graphql-transport-ws", 0)
	defer flood.Close()
	flood.send(t, websocket.MessageText, `{"type":"connection_init"}`)
	flood.expectText(t, `{"type":"connection_ack"`)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer flood.Close() // before the wait: ends a flood stuck in a write
	wg.Add(1)
	go func() {
		defer wg.Done()
		for range 5000 {
			if flood.writeFrame(true, opPing, []byte("x")) != nil {
				return
			}
		}
	}()
	if code, _ := flood.closeCode(t, 10*time.Second); code != websocket.StatusPolicyViolation {
		t.Fatalf("GraphQL ping flood: close %v, want 1008", code)
	}
	flood.Close()

	waitCounted(t, e, "GraphQL closes counted by reason", func() bool {
		return reason("init_timeout")-init0 == 1 && reason("protocol_error")-proto0 == 1 && reason("policy")-policy0 == 1
	})
}

// TestRateLimitedErrorsCarryTheirIDs: 250 subscribes written at once, over
// the default message rate (100/s, burst 200): each id is answered exactly
// once, subscribed or rate_limited with that id (a client can tell which
// of its messages were dropped), and some are rate_limited.
func TestRateLimitedErrorsCarryTheirIDs(t *testing.T) {
	const n = 250
	e := newEnv(t, nil)
	c := upgradeRaw(t, e, 0)
	defer c.Close()
	var burst bytes.Buffer
	for i := range n {
		c.appendFrame(&burst, true, opText, []byte(fmt.Sprintf(`{"type":"subscribe","id":"s%d","subject":"orders.rate.%d"}`, i, i)))
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	defer c.Close() // before the wait: ends a write stuck on a failed test
	wg.Add(1)
	go func() { // one write; the test goroutine reads meanwhile
		defer wg.Done()
		c.wm.Lock()
		defer c.wm.Unlock()
		_, _ = c.c.Write(burst.Bytes())
	}()
	answers := make(map[string]string, n) // id → subscribed, or the error code
	limited := 0
	_ = c.c.SetReadDeadline(time.Now().Add(20 * time.Second))
	for len(answers) < n {
		op, p, err := c.next()
		if err != nil {
			t.Fatalf("after %d answers: %v", len(answers), err)
		}
		if op != opText {
			t.Fatalf("after %d answers: opcode %d %q", len(answers), op, p)
		}
		for line := range strings.SplitSeq(string(p), "\n") {
			var m struct{ Type, ID, Code string }
			if err := json.Unmarshal([]byte(line), &m); err != nil {
				t.Fatalf("%q: %v", line, err)
			}
			var answer string
			switch {
			case m.Type == "ready":
				continue
			case m.Type == "subscribed":
				answer = m.Type
			case m.Type == "error" && m.Code == gateway.CodeRateLimited:
				answer = m.Code
				limited++
			default:
				t.Fatalf("unexpected %s", line)
			}
			if i, err := strconv.Atoi(strings.TrimPrefix(m.ID, "s")); err != nil || i < 0 || i >= n || m.ID != "s"+strconv.Itoa(i) {
				t.Fatalf("%s: not the id of a subscribe sent", line)
			}
			if prev, ok := answers[m.ID]; ok {
				t.Fatalf("%s answered twice: %s, then %s", m.ID, prev, line)
			}
			answers[m.ID] = answer
		}
	}
	if limited == 0 {
		t.Fatalf("%d subscribes at once, none rate_limited", n)
	}
	if got := e.metric("fanwire_client_errors_total", map[string]string{"code": gateway.CodeRateLimited}); got != float64(limited) {
		t.Fatalf("rate_limited counted %v, want %d", got, limited)
	}
	t.Logf("%d subscribes at once: %d subscribed, %d rate_limited", n, n-limited, limited)
}

// TestSilentConnectionCostsAnIdleOne: a connection that upgrades and then
// sends nothing holds what any idle connection does: one goroutine (its
// reader; the writer exits once idle) and no buffer of note.
func TestSilentConnectionCostsAnIdleOne(t *testing.T) {
	e := newEnv(t, nil) // default pings: 30 s
	const n = 200
	base := measureFootprint()
	conns := make([]*rawWS, n)
	for i := range conns {
		conns[i] = upgradeRaw(t, e, 0)
		defer conns[i].Close()
		conns[i].expectText(t, `{"type":"ready"`)
		conns[i].br = nil // the client keeps no buffer either
	}
	var f footprint
	deadline := time.Now().Add(10 * time.Second)
	for { // writers retire 2 s after their last write
		f = measureFootprint()
		if f.goroutines-base.goroutines <= n+goroutineMargin || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	perConn := float64(f.goroutines-base.goroutines) / n
	heapPerConn := (float64(f.heap) - float64(base.heap)) / n
	t.Logf("%d silent connections: %.2f goroutines and %.1f KiB of heap each (server and raw client)", n, perConn, heapPerConn/1024)
	if f.goroutines-base.goroutines > n+goroutineMargin {
		t.Fatalf("%d silent connections hold %d goroutines, want one each (the reader)", n, f.goroutines-base.goroutines)
	}
	if heapPerConn > 64<<10 {
		t.Fatalf("a silent connection holds %.0f KiB of heap, want far less", heapPerConn/1024)
	}
	if got := e.metric("fanwire_connections", nil); got != n {
		t.Fatalf("fanwire_connections %v, want %d", got, n)
	}
}

// TestHandshakeTimeoutComesFromConfig: the timeout is the server's, from
// Config.HandshakeTimeout (--handshake-timeout): a silent connection lives
// at least that long and is then closed.
func TestHandshakeTimeoutComesFromConfig(t *testing.T) {
	e := newEnv(t, func(c *gateway.Config) { c.HandshakeTimeout = time.Second })
	c, err := net.DialTimeout("tcp", e.http.Listener.Addr().String(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	start := time.Now()
	_ = c.SetReadDeadline(time.Now().Add(15 * time.Second))
	if _, err := io.ReadAll(c); err != nil {
		t.Fatalf("silent connection not closed: %v", err)
	}
	if d := time.Since(start); d < 900*time.Millisecond {
		t.Fatalf("silent connection closed after %v, before the 1 s handshake timeout", d)
	}
	waitCounted(t, e, "handshake timeout counted", func() bool {
		return e.metric("fanwire_connections_rejected_total", map[string]string{"reason": "handshake_timeout"}) == 1
	})
	// An HTTP request that completes in time is not a handshake timeout,
	// however long the keep-alive connection then lasts.
	resp, err := http.Get(e.http.URL + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if got := e.metric("fanwire_connections_rejected_total", map[string]string{"reason": "handshake_timeout"}); got != 1 {
		t.Fatalf("handshake_timeout %v, want 1", got)
	}
}

// TestMaxHandshakes: with MaxHandshakes connections waiting for their
// first request, a new TCP connection is closed at once and counted as
// max_handshakes; once the waiting ones are gone, clients connect again.
func TestMaxHandshakes(t *testing.T) {
	const max, over = 50, 20
	e := newEnv(t, func(c *gateway.Config) { c.MaxHandshakes = max; c.HandshakeTimeout = 30 * time.Second })
	addr := e.http.Listener.Addr().String()
	dial := func() net.Conn {
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	var silent []net.Conn
	defer func() {
		for _, c := range silent {
			c.Close()
		}
	}()
	for range max {
		silent = append(silent, dial())
	}
	waitCounted(t, e, "the silent connections pending", func() bool { return gateway.PendingHandshakes(e.srv) == max })
	for i := range over {
		c := dial()
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		got, err := io.ReadAll(c)
		c.Close()
		if (err != nil && !errors.Is(err, syscall.ECONNRESET)) || len(got) != 0 {
			t.Fatalf("connection %d over the cap: read %q, %v; want it closed at once without an answer", i, got, err)
		}
	}
	waitCounted(t, e, "max_handshakes counted", func() bool {
		return e.metric("fanwire_connections_rejected_total", map[string]string{"reason": "max_handshakes"}) == over
	})
	for _, c := range silent {
		c.Close()
	}
	silent = nil
	waitCounted(t, e, "the silent connections forgotten", func() bool { return gateway.PendingHandshakes(e.srv) == 0 })
	cl := e.dial()
	cl.subscribe("s", "orders.>")
}

// feed is the well-behaved side: clients subscribed to one subject and a
// publisher sending it a numbered sequence for the whole suite.
type feed struct {
	subject string
	stop    chan struct{}
	last    chan int // the publisher's count when stopped
	pubErr  atomic.Pointer[error]
	wg      sync.WaitGroup // the publisher and the readers
	cancel  context.CancelFunc
	readers []*feedReader
}

type feedReader struct {
	got    atomic.Int64 // events received in order
	err    atomic.Pointer[error]
	last   atomic.Int64 // UnixNano of the last event
	maxGap atomic.Int64 // longest time between two events since resetGaps, in ns
}

func (f *feed) resetGaps() {
	for _, r := range f.readers {
		r.maxGap.Store(0)
	}
}

func (f *feed) maxGap() time.Duration {
	var m int64
	for _, r := range f.readers {
		m = max(m, r.maxGap.Load())
	}
	return time.Duration(m)
}

func startFeed(t *testing.T, e *env, clients int, subject string) *feed {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	f := &feed{subject: subject, stop: make(chan struct{}), last: make(chan int, 1), cancel: cancel}
	for range clients {
		cl := e.dial()
		cl.subscribe("f", subject)
		r := &feedReader{}
		f.readers = append(f.readers, r)
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			for {
				_, b, err := cl.c.Read(ctx)
				if err != nil {
					if ctx.Err() == nil {
						r.err.Store(&err)
					}
					return
				}
				for line := range bytes.SplitSeq(b, []byte("\n")) {
					var m struct {
						Type string `json:"type"`
						Data struct {
							N int64 `json:"n"`
						} `json:"data"`
					}
					if err := json.Unmarshal(line, &m); err != nil || m.Type != "event" || m.Data.N != r.got.Load() {
						err := fmt.Errorf("after %d events in order, got %s", r.got.Load(), line)
						r.err.Store(&err)
						return
					}
					r.got.Add(1)
				}
				now := time.Now().UnixNano()
				if prev := r.last.Swap(now); prev != 0 && now-prev > r.maxGap.Load() {
					r.maxGap.Store(now - prev)
				}
			}
		}()
	}
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		tick := time.NewTicker(2 * time.Millisecond)
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-f.stop:
				f.last <- i
				return
			case <-tick.C:
			}
			if err := e.nc.Publish(subject, []byte(`{"n":`+strconv.Itoa(i)+`}`)); err != nil {
				f.pubErr.Store(&err)
				f.last <- i
				return
			}
		}
	}()
	t.Cleanup(f.halt)
	return f
}

// halt stops the publisher and the readers and waits for them (idempotent).
func (f *feed) halt() {
	select {
	case <-f.stop:
	default:
		close(f.stop)
	}
	f.cancel()
	f.wg.Wait()
}

// finish stops publishing and checks that every reader got every event
// exactly once, in order.
func (f *feed) finish(t *testing.T, e *env) {
	t.Helper()
	close(f.stop)
	n := <-f.last
	if p := f.pubErr.Load(); p != nil {
		t.Fatalf("publisher: %v", *p)
	}
	if err := e.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for i, r := range f.readers {
		for r.got.Load() < int64(n) && r.err.Load() == nil && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		if p := r.err.Load(); p != nil {
			t.Fatalf("good client %d: %v", i, *p)
		}
		if got := r.got.Load(); got != int64(n) {
			t.Fatalf("good client %d: %d of %d events", i, got, n)
		}
	}
	if d := e.metric("fanwire_events_dropped_total", nil); d != 0 {
		t.Fatalf("%v events dropped before dispatch", d)
	}
	t.Logf("%d good clients each got all %d events, once and in order, through the abuse", len(f.readers), n)
	f.halt()
}

// waitCounted is waitFor that shows the gateway's disconnect and
// rejection counters when it times out.
func waitCounted(t *testing.T, e *env, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			var b strings.Builder
			mfs, _ := e.reg.Gather()
			for _, mf := range mfs {
				if n := mf.GetName(); n == "fanwire_disconnects_total" || n == "fanwire_connections_rejected_total" || n == "fanwire_client_errors_total" || n == "fanwire_connections" {
					for _, m := range mf.GetMetric() {
						v := m.GetGauge().GetValue()
						if m.Counter != nil {
							v = m.GetCounter().GetValue()
						}
						fmt.Fprintf(&b, "\n  %s%v %v", n, m.GetLabel(), v)
					}
				}
			}
			t.Fatalf("timed out waiting for %s; counters:%s", what, b.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

type footprint struct {
	goroutines int
	heap       uint64
}

func measureFootprint() footprint {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return footprint{goroutines: runtime.NumGoroutine(), heap: ms.HeapAlloc}
}

// checkFootprint waits (up to 10 s: writers linger 2 s, closes take up to
// CloseTimeout) for the goroutines to return to within a small margin of
// base and the heap to be within hostileHeapBound of it.
func checkFootprint(t *testing.T, base footprint) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		f := measureFootprint()
		if f.goroutines <= base.goroutines+goroutineMargin && f.heap <= base.heap+hostileHeapBound {
			t.Logf("after: %d goroutines (baseline %d), heap %.1f MiB (baseline %.1f)", f.goroutines, base.goroutines,
				float64(f.heap)/(1<<20), float64(base.heap)/(1<<20))
			return
		}
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			buf = buf[:runtime.Stack(buf, true)]
			t.Fatalf("leak: %d goroutines (baseline %d), heap %.1f MiB (baseline %.1f)\n%s", f.goroutines, base.goroutines,
				float64(f.heap)/(1<<20), float64(base.heap)/(1<<20), buf)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// raiseFDLimit raises the soft limit on open files to at least need (up to
// the hard limit) for the test's duration.
func raiseFDLimit(t *testing.T, need uint64) {
	t.Helper()
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	if lim.Cur >= need {
		return
	}
	if lim.Max < need {
		t.Fatalf("open files: hard limit %d, the test needs %d", lim.Max, need)
	}
	old := lim
	lim.Cur = need
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &old) })
}
