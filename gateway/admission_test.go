package gateway_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/fanwire/fanwire/gateway"
)

// The connect rate's tests freeze its clock (gateway.FreezeAdmission): a
// token comes when the test advances it, never by the machine's pace, so
// every assertion is about order and counts.

// dialed is the outcome of one upgrade attempt.
type dialed struct {
	c    *websocket.Conn
	resp *http.Response
	err  error
}

// dialAsync upgrades /ws on a goroutine of its own, with hdr, until ctx is
// done; the test must receive its outcome.
func dialAsync(ctx context.Context, t *testing.T, e *env, hdr http.Header) <-chan dialed {
	ch := make(chan dialed, 1)
	go func() {
		c, resp, err := websocket.Dial(ctx, e.wsURL(), &websocket.DialOptions{HTTPHeader: hdr})
		ch <- dialed{c, resp, err}
	}()
	return ch
}

// mustAdmit fails unless d is an upgraded connection, and closes it with the test.
func mustAdmit(t *testing.T, what string, d dialed) {
	t.Helper()
	if d.err != nil {
		t.Fatalf("%s: %v, want it admitted", what, d.err)
	}
	t.Cleanup(func() { _ = d.c.CloseNow() })
}

// mustRefuse fails unless d was refused with status and code before the
// upgrade, with a Retry-After of at least one second.
func mustRefuse(t *testing.T, what string, d dialed, status int, code string) {
	t.Helper()
	if d.err == nil {
		_ = d.c.CloseNow()
		t.Fatalf("%s: admitted, want %d %s", what, status, code)
	}
	if d.resp == nil || d.resp.StatusCode != status {
		t.Fatalf("%s: %v (response %v), want %d", what, d.err, d.resp, status)
	}
	if !d.resp.Close {
		t.Fatalf("%s: the refusal keeps the connection alive", what)
	}
	if s, err := strconv.Atoi(d.resp.Header.Get("Retry-After")); err != nil || s < 1 {
		t.Fatalf("%s: Retry-After %q, want a number of seconds", what, d.resp.Header.Get("Retry-After"))
	}
	var body struct{ Error, Code string }
	b, _ := io.ReadAll(d.resp.Body)
	if err := json.Unmarshal(b, &body); err != nil || body.Code != code || body.Error == "" {
		t.Fatalf("%s: body %s, want code %q", what, b, code)
	}
}

// dialNow upgrades /ws and returns the outcome.
func dialNow(t *testing.T, e *env, hdr http.Header) dialed {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return <-dialAsync(ctx, t, e, hdr)
}

// waitQueued waits until n upgrade requests wait for admission.
func waitQueued(t *testing.T, e *env, n int) {
	t.Helper()
	waitFor(t, strconv.Itoa(n)+" upgrade requests queued", func() bool {
		return e.metric("fanwire_connect_queue", nil) == float64(n)
	})
}

// connectWait returns fanwire_connect_wait_seconds' count and sum.
func connectWait(t *testing.T, e *env) (uint64, float64) {
	t.Helper()
	mfs, err := e.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "fanwire_connect_wait_seconds" {
			h := mf.GetMetric()[0].GetHistogram()
			return h.GetSampleCount(), h.GetSampleSum()
		}
	}
	t.Fatal("no fanwire_connect_wait_seconds")
	return 0, 0
}

// rateEnv is a gateway admitting one upgrade per second of its frozen
// clock, burst 1, with mutate applied on top.
func rateEnv(t *testing.T, mutate func(*gateway.Config)) (*env, *gateway.AdmissionClock) {
	e := newEnv(t, func(c *gateway.Config) {
		c.MaxConnectRate = 1
		c.ConnectBurst = 1
		c.ConnectQueue = 4
		c.ConnectQueueWait = time.Hour
		if mutate != nil {
			mutate(c)
		}
	})
	return e, gateway.FreezeAdmission(e.srv)
}

// TestConnectRateAdmitsInOrder: past the rate, upgrade requests wait and
// are admitted one per token, first come first served.
func TestConnectRateAdmitsInOrder(t *testing.T) {
	e, clk := rateEnv(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	mustAdmit(t, "the burst's connection", dialNow(t, e, nil))
	b := dialAsync(ctx, t, e, nil)
	waitQueued(t, e, 1)
	c := dialAsync(ctx, t, e, nil)
	waitQueued(t, e, 2)
	// Waiting requests are handshakes not done: --max-handshakes bounds
	// them with the connections that have sent nothing yet.
	if n := gateway.PendingHandshakes(e.srv); n != 2 {
		t.Fatalf("%d pending handshakes, want the 2 waiting requests", n)
	}

	clk.Advance(time.Second)
	mustAdmit(t, "the first waiter, at the first token", <-b)
	select {
	case d := <-c:
		t.Fatalf("the second waiter got through on the first waiter's token: %v", d.err)
	default:
	}
	if n := e.metric("fanwire_connect_queue", nil); n != 1 {
		t.Fatalf("%v waiting, want the second waiter only", n)
	}
	clk.Advance(time.Second)
	mustAdmit(t, "the second waiter, at the second token", <-c)
	waitQueued(t, e, 0)
	if n, sum := connectWait(t, e); n != 3 || sum != 0+1+2 {
		t.Fatalf("connect wait: %d admissions, %v s in all; want 3 and 0+1+2 s", n, sum)
	}
	if n := e.metric("fanwire_connections_rejected_total", map[string]string{"reason": "connect_rate"}); n != 0 {
		t.Fatalf("%v connect_rate refusals, want none", n)
	}
}

// TestConnectRateRefusals: with the queue full, or when its turn would come
// after the longest wait, an upgrade request is refused at once with 503,
// Retry-After and code connect_rate, counted by reason; those queued are
// still admitted.
func TestConnectRateRefusals(t *testing.T) {
	for _, tc := range []struct {
		name   string
		queue  int
		wait   time.Duration
		queued int // requests that wait before one is refused
	}{
		{"queue full", 2, time.Hour, 2},
		{"wait too long", 100, 3 * time.Second, 3}, // the 4th's turn would come after 4 s
		{"no queue", -1, time.Hour, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, clk := rateEnv(t, func(c *gateway.Config) {
				c.ConnectQueue = tc.queue
				c.ConnectQueueWait = tc.wait
			})
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			mustAdmit(t, "the burst's connection", dialNow(t, e, nil))
			var waiting []<-chan dialed
			for i := range tc.queued {
				waiting = append(waiting, dialAsync(ctx, t, e, nil))
				waitQueued(t, e, i+1)
			}
			mustRefuse(t, "one over", dialNow(t, e, nil), http.StatusServiceUnavailable, gateway.CodeConnectRate)
			if n := e.metric("fanwire_connections_rejected_total", map[string]string{"reason": "connect_rate"}); n != 1 {
				t.Fatalf("%v connect_rate refusals counted, want 1", n)
			}
			for i, w := range waiting {
				clk.Advance(time.Second)
				mustAdmit(t, "waiter "+strconv.Itoa(i), <-w)
			}
			waitQueued(t, e, 0)
		})
	}
}

// TestConnectQueueLeave: a waiting client that gives up leaves the queue,
// and the one behind it takes its turn.
func TestConnectQueueLeave(t *testing.T) {
	e, clk := rateEnv(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	mustAdmit(t, "the burst's connection", dialNow(t, e, nil))
	quitCtx, quit := context.WithCancel(ctx)
	defer quit()
	first := dialAsync(quitCtx, t, e, nil)
	waitQueued(t, e, 1)
	second := dialAsync(ctx, t, e, nil)
	waitQueued(t, e, 2)

	quit()
	if d := <-first; !errors.Is(d.err, context.Canceled) {
		t.Fatalf("a client that gave up: %v", d.err)
	}
	waitQueued(t, e, 1)
	clk.Advance(time.Second)
	mustAdmit(t, "the waiter behind the one that left", <-second)
	waitQueued(t, e, 0)
	if n := e.metric("fanwire_connections_rejected_total", map[string]string{"reason": "connect_rate"}); n != 0 {
		t.Fatalf("%v connect_rate refusals, want none: the client left by itself", n)
	}
}

// TestConnectQueueShutdown: a request still waiting when the gateway drains
// is answered 503 shutting_down (Shutdown does not wait for its turn).
func TestConnectQueueShutdown(t *testing.T) {
	if testing.Short() {
		t.Skip("-short (make test-quick) leaves out the slow tests: make test runs them")
	}
	e, _ := rateEnv(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	mustAdmit(t, "the burst's connection", dialNow(t, e, nil))
	w := dialAsync(ctx, t, e, nil)
	waitQueued(t, e, 1)
	e.stop()
	mustRefuse(t, "a waiter at shutdown", <-w, http.StatusServiceUnavailable, gateway.CodeShuttingDown)
	if n := e.metric("fanwire_connect_queue", nil); n != 0 {
		t.Fatalf("%v still waiting after shutdown", n)
	}
}

// TestTrustedProxies: X-Forwarded-For names the client only when the peer
// is a trusted proxy (here the test itself, 127.0.0.1), and is read from
// the right: the per-address cap counts the forwarded address then, and
// the socket's otherwise. A malformed entry falls back to the trusted hop.
func TestTrustedProxies(t *testing.T) {
	xff := func(v ...string) http.Header {
		h := http.Header{}
		for _, s := range v {
			h.Add("X-Forwarded-For", s)
		}
		return h
	}
	loopback, err := gateway.ParseTrustedProxies([]string{"127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	elsewhere, err := gateway.ParseTrustedProxies([]string{"10.0.0.0/8", "2001:db8::/32"})
	if err != nil {
		t.Fatal(err)
	}

	t.Run("trusted", func(t *testing.T) {
		e := newEnv(t, func(c *gateway.Config) { c.TrustedProxies = loopback; c.MaxConnectionsPerIP = 1 })
		mustAdmit(t, "client .1", dialNow(t, e, xff("198.51.100.1")))
		mustAdmit(t, "client .2", dialNow(t, e, xff("198.51.100.2")))
		// The entry the proxy appended is the rightmost; what the client
		// wrote before it is not believed.
		mustAdmit(t, "client .3 forging .1", dialNow(t, e, xff("198.51.100.1, 198.51.100.3")))
		for _, h := range []http.Header{
			xff("198.51.100.1"),
			xff("198.51.100.9, 198.51.100.1"),
			xff("198.51.100.1, 127.0.0.1"),                 // a trusted hop is skipped
			xff("198.51.100.9", "198.51.100.1, 127.0.0.1"), // header lines are one list
			xff("198.51.100.1:4711"),
		} {
			mustRefuse(t, "client .1 again, as "+h.Get("X-Forwarded-For"), dialNow(t, e, h), http.StatusTooManyRequests, gateway.CodeMaxConnectionsPerIP)
		}
		// Without the header, or with a malformed entry where the client
		// should be, the client is the trusted peer itself: one of those.
		mustAdmit(t, "no header", dialNow(t, e, nil))
		for _, h := range []http.Header{
			xff("not-an-address"),
			xff("198.51.100.4, bogus"),
			xff("198.51.100.5, 127.0.0.1:99999"),
		} {
			mustRefuse(t, "malformed "+h.Get("X-Forwarded-For"), dialNow(t, e, h), http.StatusTooManyRequests, gateway.CodeMaxConnectionsPerIP)
		}
		// RFC 9110 §5.6.1: empty list elements are no hop.
		mustAdmit(t, "client .6 before an empty entry", dialNow(t, e, xff("198.51.100.6, 127.0.0.1, ")))
		if n := e.metric("fanwire_connections_rejected_total", map[string]string{"reason": "max_connections_per_ip"}); n != 8 {
			t.Fatalf("%v per-address refusals counted, want 8", n)
		}
	})
	t.Run("untrusted", func(t *testing.T) {
		e := newEnv(t, func(c *gateway.Config) { c.TrustedProxies = elsewhere; c.MaxConnectionsPerIP = 1 })
		mustAdmit(t, "first", dialNow(t, e, xff("198.51.100.1")))
		mustRefuse(t, "another forwarded address from the same socket address", dialNow(t, e, xff("198.51.100.2")), http.StatusTooManyRequests, gateway.CodeMaxConnectionsPerIP)
	})
}

// TestIPv6PrefixCap: the per-address cap counts an IPv6 client by its
// prefix (IPLimitIPv6Prefix, default /64: one host's whole allocation), an
// IPv4 client, IPv4-mapped ones included, by its address. The addresses
// come as X-Forwarded-For from a trusted proxy (the test itself), since
// the machine has only ::1; the refused ones are released by group too.
func TestIPv6PrefixCap(t *testing.T) {
	loopback, err := gateway.ParseTrustedProxies([]string{"127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	xff := func(a string) http.Header { return http.Header{"X-Forwarded-For": {a}} }
	start := func(t *testing.T, bits int) *env {
		return newEnv(t, func(c *gateway.Config) {
			c.TrustedProxies = loopback
			c.MaxConnectionsPerIP = 2
			c.IPLimitIPv6Prefix = bits
		})
	}
	refuse := func(t *testing.T, e *env, a string) {
		t.Helper()
		mustRefuse(t, a, dialNow(t, e, xff(a)), http.StatusTooManyRequests, gateway.CodeMaxConnectionsPerIP)
	}
	admit := func(t *testing.T, e *env, a string) *websocket.Conn {
		t.Helper()
		d := dialNow(t, e, xff(a))
		mustAdmit(t, a, d)
		return d.c
	}

	t.Run("default /64", func(t *testing.T) {
		e := start(t, 0)
		first := admit(t, e, "2001:db8:1:2::1")
		admit(t, e, "2001:db8:1:2:ffff:ffff:ffff:fffe")
		refuse(t, e, "2001:db8:1:2::3")
		refuse(t, e, "[2001:db8:1:2:abcd::9]:4711")
		admit(t, e, "2001:db8:1:3::1") // the next /64
		// IPv4 per address; a mapped address is that IPv4 address.
		admit(t, e, "198.51.100.1")
		admit(t, e, "198.51.100.2")
		admit(t, e, "::ffff:198.51.100.1")
		refuse(t, e, "198.51.100.1")
		refuse(t, e, "::ffff:198.51.100.1")
		// A connection of the /64 ends: another address of it gets in.
		_ = first.CloseNow()
		waitFor(t, "the first connection's end", func() bool { return e.metric("fanwire_connections", nil) == 5 })
		admit(t, e, "2001:db8:1:2::42")
		refuse(t, e, "2001:db8:1:2::43")
		if n := e.metric("fanwire_connections_rejected_total", map[string]string{"reason": "max_connections_per_ip"}); n != 5 {
			t.Fatalf("%v per-address refusals counted, want 5", n)
		}
	})
	t.Run("/48", func(t *testing.T) {
		e := start(t, 48)
		admit(t, e, "2001:db8:1:2::1")
		admit(t, e, "2001:db8:1:ffff::1")
		refuse(t, e, "2001:db8:1:7::1")
		admit(t, e, "2001:db8:2::1")
	})
	t.Run("/128: exact addresses", func(t *testing.T) {
		e := start(t, 128)
		admit(t, e, "2001:db8:1:2::1")
		admit(t, e, "2001:db8:1:2::1")
		refuse(t, e, "2001:db8:1:2::1")
		admit(t, e, "2001:db8:1:2::2")
	})
	t.Run("out of range", func(t *testing.T) {
		e := newEnv(t, nil)
		for _, bits := range []int{-1, 129} {
			if _, err := gateway.New(gateway.Config{Broker: e.b, IPLimitIPv6Prefix: bits}); err == nil || !strings.Contains(err.Error(), "IPLimitIPv6Prefix must be 1 to 128") {
				t.Errorf("prefix %d: %v, want an error naming IPLimitIPv6Prefix", bits, err)
			}
		}
	})
}
