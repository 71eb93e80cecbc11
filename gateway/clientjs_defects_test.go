package gateway_test

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/fanwire/fanwire/broker/brokertest"
	"github.com/golang-jwt/jwt/v5"
)

// TestClientDefects holds one test per defect of fanwire.js that issue 24
// names, each run in Node against real gateways (fanwire ws processes on an
// embedded NATS server, or an in-process gateway where a test needs a
// state fanwire ws does not hold long enough): run.mjs and scenario.mjs
// (testdata/fanwirejs) are the apps. The subtests run in parallel; the
// nodes they share are started once.
func TestClientDefects(t *testing.T) {
	node := requireClientFixture(t)
	bin := buildFanwire(t)
	url := brokertest.NATS(t).ClientURL()
	js := brokertest.JetStream(t, url)
	// Every node is on one stream over app.>; each subtest has subjects of
	// its own (app.<test>.…, three tokens or more), and only the durable's
	// test uses app.0 … app.3, which no other pattern matches.
	const stream = "DEFECTS"
	shared := startGateway(t, bin, jsNodeArgs(url, stream, "--allow-anonymous-publish")...)
	// A node of 20 client messages per second (burst 40): 300 messages take
	// 13 s at least, and a client that sends faster is refused some.
	const lowRate = "20"
	rated := startGateway(t, bin, jsNodeArgs(url, stream, "--allow-anonymous-publish", "--max-message-rate", lowRate)...)

	t.Run("close in every state", func(t *testing.T) {
		t.Parallel()
		// A closed port: connecting there fails at once, and the client
		// waits to retry.
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		deadURL := "ws://" + l.Addr().String() + "/ws"
		l.Close()
		whens := []string{"connecting", "tokenPending", "retrying", "connected", "twice",
			"inConnecting", "inConnected", "inDisconnected", "inError", "inSubscribed", "inSubSubscribed", "inEvent", "reconnectInConnected"}
		impls := []struct {
			name   string
			native bool
			flags  []string
		}{
			{"ws package", false, nil},
			{"Node's WebSocket", true, []string{"--experimental-websocket"}},
		}
		for _, impl := range impls {
			for _, when := range whens {
				t.Run(impl.name+"/"+when, func(t *testing.T) {
					t.Parallel()
					r := runScript(t, node, impl.flags, "scenario.mjs", map[string]any{"scenario": "close", "when": when,
						"url": shared.wsURL(), "deadURL": deadURL, "subject": "app.close." + when, "nativeWebSocket": impl.native}, nil)
					if when == "retrying" || when == "inDisconnected" {
						// A refused connection is seen at once, unless the
						// client waits for its connectTimeout (60 s here):
						// Node 20's own WebSocket (undici) fires "error"
						// and never "close" for a connection that failed,
						// so a client that waits for "close" waits that long.
						r.waitFor("disconnected state after connecting to a closed port", clientWait, func(l []jsLine) bool {
							return count(l, "state", "disconnected") > 0
						})
					}
					// A leak keeps the process alive for ever (the ping
					// interval repeats every 25 s, the other timers are
					// made 60 s long): 20 s is not a race.
					code := r.exitCode(t, 20*time.Second)
					lines := r.all()
					closeAt := -1
					for i, l := range lines {
						if l.K == "close" {
							closeAt = i
							break
						}
					}
					if code != 0 || closeAt < 0 {
						t.Fatalf("the Node process ended with code %d (want 0, after close()); its lines:\n%s\nstderr:\n%s", code, r.summary(), r.stderr.String())
					}
					for _, l := range lines[closeAt:] {
						if l.K == "state" && l.State != "closed" && l.State != "disconnected" {
							t.Fatalf("state %q after close(): a closed client came back; its lines:\n%s", l.State, r.summary())
						}
					}
					if count(lines, "state", "closed") != 1 {
						t.Fatalf("want one \"closed\" state; its lines:\n%s", r.summary())
					}
				})
			}
		}
	})

	t.Run("from and durable null are absent", func(t *testing.T) {
		t.Parallel()
		// {from: localStorage.getItem(k)} on a first visit: null. The node
		// has no --anonymous-durables, so a durable named "null" would be
		// refused as well.
		c := runClient(t, node, map[string]any{"urls": []string{shared.wsURL()}, "subs": []map[string]any{
			{"pattern": "app.nulls.>", "from": nil},
			{"pattern": "app.nulls.>", "durable": nil},
		}}, nil)
		c.waitFor("both subscribed, or an error", clientWait, func(l []jsLine) bool {
			return count(l, "subscribed", "") >= 2 || count(l, "error", "") > 0
		})
		if count(c.all(), "error", "") > 0 {
			t.Fatalf("a subscription failed:\n%s", c.summary())
		}
		for i := range 5 {
			if _, err := js.Publish(context.Background(), "app.nulls.x", fmt.Appendf(nil, `{"n":%d}`, i)); err != nil {
				t.Fatal(err)
			}
		}
		c.waitEvents(10, clientWait)
		for _, sub := range []string{"s1", "s2"} {
			var got []int
			for _, l := range c.all() {
				if l.K == "event" && l.Sub == sub {
					got = append(got, l.Data.N)
				}
			}
			checkSequence(t, got, 5)
		}
	})

	t.Run("a 70 KB publish is refused locally", func(t *testing.T) {
		t.Parallel()
		c := runClient(t, node, map[string]any{"urls": []string{shared.wsURL()}}, nil)
		c.waitFor("connected", clientWait, func(l []jsLine) bool { return count(l, "state", "connected") > 0 })
		answered := func(n int) func([]jsLine) bool {
			return func(l []jsLine) bool { return count(l, "published", "")+count(l, "publish_error", "") >= n }
		}
		// Over the gateway's 64 KiB read limit: sent, it would close the
		// connection with 1009.
		c.send(map[string]any{"cmd": "publish", "subject": "app.large.x", "data": strings.Repeat("x", 70_000)})
		c.waitFor("the large publish's answer", clientWait, answered(1))
		c.send(map[string]any{"cmd": "publish", "subject": "app.large.x", "data": map[string]int{"n": 1}})
		c.waitFor("the small publish's answer", clientWait, answered(2))
		var answers []jsLine
		for _, l := range c.all() {
			if l.K == "published" || l.K == "publish_error" {
				answers = append(answers, l)
			}
		}
		if answers[0].K != "publish_error" || answers[0].Code != "too_large" || answers[1].K != "published" {
			t.Fatalf("want the large publish refused with too_large and the small one published:\n%s", c.summary())
		}
		lines := c.all()
		if count(lines, "state", "connected") != 1 || count(lines, "state", "disconnected") != 0 {
			t.Fatalf("the connection did not stay:\n%s", c.summary())
		}
	})

	// 300 publishes against the low rate: every one published once, in
	// order, with the client's own pacing (half the gateway's limits) and
	// with options that overrun the gateway (refused ones sent again).
	for _, pc := range []struct {
		name    string
		options map[string]any
	}{
		{"default pacing", nil},
		{"overrunning the gateway", map[string]any{"messageRate": 1000, "messageBurst": 1000}},
	} {
		t.Run("300 publishes at "+lowRate+" per second, "+pc.name, func(t *testing.T) {
			t.Parallel()
			const publishes = 300
			subject := "app.rate." + strings.ReplaceAll(pc.name, " ", "_")
			r := runScript(t, node, nil, "scenario.mjs", map[string]any{"scenario": "publishes", "url": rated.wsURL(),
				"subject": subject, "count": publishes, "options": pc.options}, nil)
			// After the 300, the script publishes a marker: in the stream
			// it follows every event of theirs, a resend too, so once it
			// is delivered nothing of theirs is still on the way.
			r.waitFor("every publish answered and the marker event", 90*time.Second, func(l []jsLine) bool {
				ns := eventNs(l)
				return count(l, "published", "")+count(l, "publish_error", "") == publishes+1 && len(ns) > 0 && ns[len(ns)-1] == publishes
			})
			lines := r.all()
			if count(lines, "publish_error", "") > 0 || count(lines, "published", "") != publishes+1 {
				t.Fatalf("want all %d publishes (and the marker) published:\n%s", publishes, r.summary())
			}
			ns := eventNs(lines)
			checkSequence(t, ns[:len(ns)-1], publishes)
		})
	}

	t.Run("300 unsubscribes at "+lowRate+" per second", func(t *testing.T) {
		t.Parallel()
		// A node of its own: its subscriptions gauge counts this client's
		// only.
		n := startGateway(t, bin, jsNodeArgs(url, stream, "--max-message-rate", lowRate, "--max-subscriptions", "300")...)
		r := runScript(t, node, nil, "scenario.mjs", map[string]any{"scenario": "subs", "url": n.wsURL(),
			"prefix": "app.subs", "count": 300, "options": map[string]any{"messageRate": 1000, "messageBurst": 1000}}, nil)
		r.waitFor("300 subscribed, then unsubscribed", 90*time.Second, func(l []jsLine) bool { return count(l, "all_unsubscribed", "") > 0 })
		// The gateway holds none once every unsubscribe has reached it;
		// one dropped for good leaves the gauge above 0 for ever.
		deadline := time.Now().Add(60 * time.Second)
		for nodeMetric(t, n, "fanwire_subscriptions") != 0 {
			if time.Now().After(deadline) {
				t.Fatalf("the gateway still holds %v subscriptions after the client unsubscribed all 300:\n%s",
					nodeMetric(t, n, "fanwire_subscriptions"), r.summary())
			}
			time.Sleep(50 * time.Millisecond)
		}
		// ... on the connection that subscribed: a reconnect would have
		// emptied the gauge too.
		if conns := nodeMetric(t, n, "fanwire_connections"); conns != 1 || count(r.all(), "state", "disconnected") != 0 {
			t.Fatalf("%v connections at the gateway, want the client's one, never dropped:\n%s", conns, r.summary())
		}
	})

	t.Run("a draining node is retried with backoff", func(t *testing.T) {
		t.Parallel()
		// fanwire ws closes its listener on SIGTERM before it drains, so
		// its own upgrades are refused by the kernel; a gateway that
		// accepts upgrades while draining (behind a load balancer that
		// still routes to it, or with connections racing the drain) closes
		// them with 1001 before ready. An in-process gateway keeps serving
		// HTTP after Shutdown: every upgrade then gets that 1001.
		e := newEnv(t, nil)
		const clients = 20
		r := runScript(t, node, nil, "scenario.mjs", map[string]any{"scenario": "many", "url": e.wsURL(), "count": clients}, nil)
		r.waitFor("every client connected", clientWait, func(l []jsLine) bool {
			up := map[int]bool{}
			for _, x := range l {
				if x.K == "state" && x.State == "connected" {
					up[x.Client] = true
				}
			}
			return len(up) == clients
		})
		start := time.Now()
		drained := make(chan error, 1)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			drained <- e.srv.Shutdown(ctx)
		}()
		// The window is what is measured, not a wait for something.
		const window = 5 * time.Second
		time.Sleep(window)
		if err := <-drained; err != nil {
			t.Fatalf("drain: %v", err)
		}
		// After a 1001 following ready the client waits a random time in
		// [0, 500 ms], then each failed attempt n (1001 before ready) a
		// random time in [0, min(30 s, 500 ms·2^n)]. 20 attempts in 5 s
		// need all those delays to fit in 5 s: from the 7th on each may
		// be up to 30 s, and fits with a probability of 1/6 at most, so
		// 20 happen with a probability under (1/6)^13 < 1e-10 per client.
		// A client that retries at once after 1001 makes hundreds.
		const maxAttempts = 20
		attempts := map[int]int{}
		for _, l := range r.all() {
			if l.K == "state" && l.State == "connecting" && l.at.After(start) && l.at.Before(start.Add(window)) {
				attempts[l.Client]++
			}
		}
		for c := range clients {
			if attempts[c] > maxAttempts {
				t.Errorf("client %d connected %d times in %v at a draining node, want at most %d", c, attempts[c], window, maxAttempts)
			}
		}
		t.Logf("attempts per client in %v: %v", window, attempts)
		// The window did test a draining node that takes upgrades.
		if e.metric("fanwire_connections_rejected_total", map[string]string{"reason": "shutting_down"}) == 0 {
			t.Fatal("no upgrade was refused for the drain: the clients did not meet a draining node")
		}
	})

	t.Run("a durable resumes after a quick reconnect to the same node", func(t *testing.T) {
		t.Parallel()
		// The client reaches the node through a proxy that can freeze a
		// connection (forward nothing, close nothing), as a dead network
		// path does. The node's pings are the defaults (30 s, 10 s): it
		// holds the frozen connection, and the durable bound to it, far
		// longer than the client takes to give up on it (its ping every
		// 300 ms, 300 ms without an answer) and resubscribe on a new
		// connection. Once that resubscribe has been refused, the proxy
		// cuts the frozen connection: the node lets the durable go, as at
		// the end of its ping timeout.
		n := startGateway(t, bin, jsNodeArgs(url, stream, "--anonymous-durables")...)
		p := brokertest.StartProxy(t, n.addr, brokertest.ProxyConfig{})
		c := runClient(t, node, map[string]any{"urls": []string{"ws://" + p.Addr() + "/ws"},
			"subs":    []map[string]any{{"pattern": "app.*", "durable": "d1", "from": "first"}},
			"options": map[string]any{"pingInterval": 300, "pongTimeout": 300}}, nil)
		c.waitFor("subscribed", clientWait, func(l []jsLine) bool { return count(l, "subscribed", "") > 0 })
		pub := startPublisher(t, jsPublish(js), publishEvery)
		c.waitEvents(100, clientWait)
		frozen := p.Freeze()
		c.waitFor("the durable's resubscribe refused", clientWait, func(l []jsLine) bool { return count(l, "error", "") > 0 })
		p.Cut(frozen)
		before := len(c.events())
		c.waitEvents(before+100, clientWait)
		published := pub.stop()
		if pub.err != nil {
			t.Fatalf("publishing: %v", pub.err)
		}
		c.waitEvents(published, clientWait)
		checkSequence(t, c.events(), published)
		for _, l := range c.all() {
			if l.K == "error" && (l.Code != "durable_in_use" || !l.Retrying || l.Sub != "s1") {
				t.Fatalf("error %+v, want durable_in_use, retrying, for s1:\n%s", l, c.summary())
			}
		}
	})

	t.Run("refreshes stay paced", func(t *testing.T) {
		t.Parallel()
		secret := writeFile(t, "secret", testSecret)
		n := startGateway(t, bin, "--broker", "jetstream", "--nats-url", url, "--stream", stream, "--subjects", "app.>", "--jwt-secret-file", secret)
		tok := func(life time.Duration) func() string {
			return func() string {
				now := time.Now()
				return sign(t, jwt.SigningMethodHS256, []byte(testSecret), "", jwt.MapClaims{"sub": "u1", "iat": now.Unix(), "exp": now.Add(life).Unix(), "subscribe": []any{"app.>"}})
			}
		}
		// A client clock 10 min ahead of the gateway's with a token of 5
		// min sees it expired: by its own clock it would refresh at once,
		// on every answer. A token of 30 days is a delay over setTimeout's
		// 2^31-1 ms, which Node and browsers run at once.
		ahead := runClient(t, node, map[string]any{"urls": []string{n.wsURL()}, "clockSkewMs": (10 * time.Minute).Milliseconds()}, tok(5*time.Minute))
		month := runClient(t, node, map[string]any{"urls": []string{n.wsURL()}}, tok(30*24*time.Hour))
		for _, c := range []*nodeRun{ahead, month} {
			c.waitFor("connected", clientWait, func(l []jsLine) bool { return count(l, "state", "connected") > 0 })
		}
		// What is measured is how many refreshes a window holds: a loop
		// makes hundreds, a paced client none (one at most).
		time.Sleep(5 * time.Second)
		for name, c := range map[string]*nodeRun{"clock 10 min ahead, token of 5 min": ahead, "token of 30 days": month} {
			lines := c.all()
			if tokens := count(lines, "token", ""); tokens > 2 || count(lines, "state", "disconnected") > 0 {
				t.Errorf("%s: %d getToken calls in 5 s (want 2 at most) or a disconnect:\n%s", name, tokens, c.summary())
			}
		}
	})

	t.Run("a getToken that hangs is timed out", func(t *testing.T) {
		t.Parallel()
		r := runScript(t, node, nil, "scenario.mjs", map[string]any{"scenario": "hangToken", "url": shared.wsURL(),
			"options": map[string]any{"tokenTimeout": 500}}, nil)
		// The first retry comes within tokenTimeout and one backoff step
		// (at most 1 s): never is the failure, not late.
		r.waitFor("getToken called again after an error", clientWait, func(l []jsLine) bool {
			return count(l, "gettoken", "") >= 2 && count(l, "error", "") > 0
		})
		var errs []jsLine
		for _, l := range r.all() {
			if l.K == "error" {
				errs = append(errs, l)
			}
		}
		if errs[0].Code != "unauthorized" || !strings.Contains(errs[0].Message, "500") {
			t.Fatalf("error %+v, want unauthorized naming the 500 ms timeout:\n%s", errs[0], r.summary())
		}
	})

	for _, kind := range []string{"throw", "reject"} {
		t.Run("an onEvent that fails: "+kind, func(t *testing.T) {
			t.Parallel()
			r := runScript(t, node, nil, "scenario.mjs", map[string]any{"scenario": "handler", "kind": kind, "url": shared.wsURL(),
				"subject": "app.handler." + kind}, nil)
			code := r.exitCode(t, 20*time.Second)
			lines := r.all()
			handler := 0
			for _, l := range lines {
				if l.K == "error" && l.Code == "handler" {
					handler++
				}
			}
			if code != 0 || handler != 1 || count(lines, "done", "") != 1 {
				t.Fatalf("exit code %d (want 0), %d handler errors (want 1), done %d; lines:\n%s\nstderr:\n%s",
					code, handler, count(lines, "done", ""), r.summary(), r.stderr.String())
			}
		})
	}
}

// exitCode waits until the Node process has ended by itself and returns
// its exit code; the test fails if it is still running after within.
func (r *nodeRun) exitCode(t *testing.T, within time.Duration) int {
	t.Helper()
	select {
	case <-r.done:
		return r.cmd.ProcessState.ExitCode()
	case <-time.After(within):
		t.Fatalf("the Node process still runs %v after it started: something of the client keeps it alive; its lines:\n%s", within, r.summary())
		return 0
	}
}
