package gateway_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	neturl "net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/fanwire/fanwire/broker/brokertest"
	"github.com/fanwire/fanwire/gateway/browsertest"
	"github.com/golang-jwt/jwt/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// fanwire.js (gateway/client) is tested against real gateways (fanwire ws
// processes, see clientjs_harness_test.go) in Node (run.mjs, over the ws
// package) and in a real Chromium (page.html, importing /fanwire.js from a
// node), and its types with tsc.

// failover is a way a node goes away while a client reads a steady stream.
type failover struct {
	name  string
	nodes int
	act   func(nodes []*gwNode)
}

var failovers = []failover{
	{"SIGKILL and restart", 1, func(ns []*gwNode) {
		ns[0].stop(syscall.SIGKILL)
		time.Sleep(300 * time.Millisecond)
		ns[0].start()
	}},
	{"SIGTERM and restart", 1, func(ns []*gwNode) {
		ns[0].stop(syscall.SIGTERM)
		time.Sleep(300 * time.Millisecond)
		ns[0].start()
	}},
	{"two nodes, one stopped for good", 2, func(ns []*gwNode) {
		ns[0].stop(syscall.SIGTERM)
	}},
}

const (
	publishEvery = 5 * time.Millisecond // 200 events/s
	clientWait   = 20 * time.Second
)

// TestClientNode: the client in Node receives every event exactly once, in
// order, while nodes die, drain or disappear; it renews tokens, reports
// gaps, paces its resubscribes and stops for a refused token.
func TestClientNode(t *testing.T) {
	node := requireClientFixture(t)
	bin := buildFanwire(t)
	// Each case has a NATS server of its own: every stream captures app.>.
	var url string
	var js jetstream.JetStream
	newNATS := func(t *testing.T) {
		url = brokertest.NATS(t).ClientURL()
		js = brokertest.JetStream(t, url)
	}

	for i, f := range failovers {
		t.Run(f.name, func(t *testing.T) {
			newNATS(t)
			stream := "NODE" + strconv.Itoa(i)
			var nodes []*gwNode
			var urls []string
			for range f.nodes {
				n := startGateway(t, bin, jsNodeArgs(url, stream)...)
				nodes = append(nodes, n)
				urls = append(urls, n.wsURL())
			}
			c := runClient(t, node, map[string]any{"urls": urls, "subs": []map[string]any{{"pattern": "app.>", "from": "first"}}}, nil)
			c.waitFor("connected", clientWait, func(l []jsLine) bool { return count(l, "state", "connected") > 0 })
			pub := startPublisher(t, jsPublish(js), publishEvery)
			c.waitEvents(100, clientWait)
			f.act(nodes)
			before := len(c.events())
			c.waitEvents(before+100, clientWait)
			n := pub.stop()
			if pub.err != nil {
				t.Fatalf("publishing: %v", pub.err)
			}
			c.waitEvents(n, clientWait)
			checkSequence(t, c.events(), n)
			lines := c.all()
			if count(lines, "state", "disconnected") == 0 {
				t.Fatalf("the client never saw its node go:\n%s", c.summary())
			}
			if f.nodes == 2 {
				last := ""
				for _, l := range lines {
					if l.K == "state" && l.State == "connected" {
						last = l.URL
					}
				}
				if last != nodes[1].wsURL() {
					t.Fatalf("the client ended on %q, want the surviving node %s:\n%s", last, nodes[1].wsURL(), c.summary())
				}
			}
		})
	}

	t.Run("slow consumer (4008) resumes", func(t *testing.T) {
		newNATS(t)
		// A mailbox of 32 messages and a dispatcher that never waits for
		// the client: an app stuck on its first event reads nothing, so
		// events of 2 KiB published until the gateway counts a slow
		// consumer (whatever the sockets' buffers hold) close it with
		// 4008; unstuck, it comes back after a backoff and resumes.
		n := startGateway(t, bin, jsNodeArgs(url, "NODESLOW", "--mailbox-messages", "32", "--max-pace", "-1ms")...)
		stall := filepath.Join(t.TempDir(), "go-on")
		c := runClient(t, node, map[string]any{"urls": []string{n.wsURL()}, "stallFile": stall,
			"subs": []map[string]any{{"pattern": "app.>", "from": "first"}}}, nil)
		// Subscribed before the first publish: a subscription that starts
		// with a replay is paced by its connection, never a slow consumer,
		// and a stall on a replayed event would hold it there.
		c.waitFor("subscribed", clientWait, func(l []jsLine) bool { return count(l, "subscribed", "") > 0 })
		pad := strings.Repeat("x", 2048)
		total := 0
		publish := func(k int) { // k events, then their acks
			t.Helper()
			for range k {
				if _, err := js.PublishAsync("app."+strconv.Itoa(total%4), fmt.Appendf(nil, `{"n":%d,"pad":%q}`, total, pad)); err != nil {
					t.Fatal(err)
				}
				total++
			}
			select {
			case <-js.PublishAsyncComplete():
			case <-time.After(clientWait):
				t.Fatal("publishes not acknowledged")
			}
		}
		// The app is stuck before the flood: it prints its first event,
		// published alone, and then reads nothing. (Flooded at once, the
		// 32-message mailbox overflowed now and then before the first
		// event reached the app: a slow consumer that was not stuck, sent
		// 4008 before it printed any event.)
		publish(1)
		c.waitEvents(1, clientWait)
		// In batches of 100, so that the app is unstuck soon after the
		// gateway counts it: a 4008 that cannot be written (the app's
		// socket is full) is lost with the socket if the app reads
		// nothing for the gateway's CloseTimeout (5 s).
		for deadline := time.Now().Add(2 * clientWait); nodeMetric(t, n, "fanwire_slow_consumers_total") == 0; {
			if time.Now().After(deadline) || total >= 200_000 {
				t.Fatalf("no slow consumer after %d events", total)
			}
			publish(100)
		}
		if err := os.WriteFile(stall, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		c.waitEvents(total, 2*clientWait)
		checkSequence(t, c.events(), total)
		lines := c.all()
		for _, l := range lines {
			if l.K == "state" && l.State == "disconnected" && fmt.Sprint(l.Code) == "4008" {
				return
			}
		}
		t.Fatalf("the gateway counted a slow consumer, but the client never saw 4008:\n%s", c.summary())
	})

	t.Run("token refresh and expiry", func(t *testing.T) {
		newNATS(t)
		secret := writeFile(t, "secret", testSecret)
		n := startGateway(t, bin, "--broker", "jetstream", "--nats-url", url, "--stream", "NODETOKEN", "--subjects", "app.>", "--jwt-secret-file", secret)
		tok := func(life time.Duration) string {
			return sign(t, jwt.SigningMethodHS256, []byte(testSecret), "", jwt.MapClaims{"sub": "u1", "exp": time.Now().Add(life).Unix(), "subscribe": []any{"app.>"}})
		}
		// First a token that expires in 3 s; the refresh before its exp
		// gets a token the gateway refuses, so the connection is closed
		// with 4001 at exp; then a good one.
		var calls int
		tokens := func() string {
			calls++
			switch calls {
			case 1:
				return tok(3 * time.Second)
			case 2:
				return "not-a-jwt"
			default:
				return tok(time.Hour)
			}
		}
		c := runClient(t, node, map[string]any{"urls": []string{n.wsURL()}, "subs": []map[string]any{{"pattern": "app.>", "from": "first"}}}, tokens)
		c.waitFor("connected", clientWait, func(l []jsLine) bool { return count(l, "state", "connected") > 0 })
		pub := startPublisher(t, jsPublish(js), publishEvery)
		c.waitFor("a reconnect after 4001", clientWait, func(l []jsLine) bool {
			for _, x := range l {
				if x.K == "state" && x.State == "disconnected" && fmt.Sprint(x.Code) == "4001" {
					return count(l, "state", "connected") >= 2
				}
			}
			return false
		})
		before := len(c.events())
		c.waitEvents(before+50, clientWait)
		published := pub.stop()
		c.waitEvents(published, clientWait)
		checkSequence(t, c.events(), published)
		lines := c.all()
		refused := false
		for _, l := range lines {
			if l.K == "error" && l.Code == "unauthorized" {
				refused = true
			}
		}
		if !refused || count(lines, "token", "") != 3 {
			t.Fatalf("want 3 getToken calls (connect, refresh, after 4001) and the refused refresh reported as unauthorized:\n%s", c.summary())
		}
	})

	t.Run("a refused token is final", func(t *testing.T) {
		newNATS(t)
		secret := writeFile(t, "secret", testSecret)
		n := startGateway(t, bin, "--broker", "jetstream", "--nats-url", url, "--stream", "NODEREFUSED", "--subjects", "app.>", "--jwt-secret-file", secret)
		// A token and no getToken: one attempt.
		c := runClient(t, node, map[string]any{"urls": []string{n.wsURL()}, "token": "not-a-jwt", "subs": []map[string]any{{"pattern": "app.>"}}}, nil)
		c.waitFor("closed", clientWait, func(l []jsLine) bool { return count(l, "state", "closed") > 0 })
		// getToken giving bad tokens: the refused token is tried again
		// once with a fresh one, then the client stops.
		g := runClient(t, node, map[string]any{"urls": []string{n.wsURL()}, "subs": []map[string]any{{"pattern": "app.>"}}}, func() string { return "still-not-a-jwt" })
		g.waitFor("closed", clientWait, func(l []jsLine) bool { return count(l, "state", "closed") > 0 })
		time.Sleep(time.Second) // nothing follows a final refusal
		for _, r := range []struct {
			c      *nodeRun
			tokens int
		}{{c, 0}, {g, 2}} {
			lines := r.c.all()
			errs := 0
			for _, l := range lines {
				if l.K == "error" && l.Code == "unauthorized" {
					errs++
				}
			}
			if count(lines, "token", "") != r.tokens || count(lines, "state", "connecting") > r.tokens || errs == 0 || lines[len(lines)-1].State != "closed" {
				t.Fatalf("want %d getToken calls, the refusal reported and the client closed for good:\n%s", r.tokens, r.c.summary())
			}
		}
	})

	t.Run("cursor expired while away", func(t *testing.T) {
		newNATS(t)
		n := startGateway(t, bin, jsNodeArgs(url, "NODEEXPIRED")...)
		c := runClient(t, node, map[string]any{"urls": []string{n.wsURL()}, "subs": []map[string]any{{"pattern": "app.>", "from": "first", "resync": "first"}}}, nil)
		c.waitFor("connected", clientWait, func(l []jsLine) bool { return count(l, "state", "connected") > 0 })
		publishN(t, js, 0, 20)
		c.waitEvents(20, clientWait)
		n.stop(syscall.SIGKILL)
		publishN(t, js, 20, 40)
		// The broker drops what the client had not read, and the cursor it
		// holds with it.
		stream, err := js.Stream(context.Background(), "NODEEXPIRED")
		if err != nil {
			t.Fatal(err)
		}
		if err := stream.Purge(context.Background()); err != nil {
			t.Fatal(err)
		}
		publishN(t, js, 40, 45)
		n.start()
		c.waitFor("a gap", clientWait, func(l []jsLine) bool { return count(l, "gap", "") > 0 })
		c.waitEvents(25, clientWait)
		got := c.events()
		want := []int{}
		for i := range 20 {
			want = append(want, i)
		}
		want = append(want, 40, 41, 42, 43, 44)
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("events %v, want %v", got, want)
		}
		var gap jsLine
		for _, l := range c.all() {
			if l.K == "gap" {
				gap = l
			}
		}
		if gap.Reason != "cursor_expired" || gap.Cursor == "" {
			t.Fatalf("gap %+v, want cursor_expired with the cursor that expired", gap)
		}
	})

	t.Run("Core NATS tells the gap", func(t *testing.T) {
		newNATS(t)
		n := startGateway(t, bin, "--broker", "nats", "--nats-url", url, "--subjects", "app.>", "--allow-anonymous")
		nc, err := nats.Connect(url)
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		c := runClient(t, node, map[string]any{"urls": []string{n.wsURL()}, "subs": []map[string]any{{"pattern": "app.>"}}}, nil)
		c.waitFor("connected", clientWait, func(l []jsLine) bool { return count(l, "state", "connected") > 0 })
		pub := startPublisher(t, nc.Publish, publishEvery)
		c.waitEvents(50, clientWait)
		n.stop(syscall.SIGKILL)
		time.Sleep(200 * time.Millisecond)
		n.start()
		c.waitFor("a gap", clientWait, func(l []jsLine) bool { return count(l, "gap", "") > 0 })
		before := len(c.events())
		c.waitEvents(before+50, clientWait)
		published := pub.stop()
		if pub.err != nil {
			t.Fatalf("publishing: %v", pub.err)
		}
		nc.Flush()
		c.waitFor("the last event", clientWait, func(l []jsLine) bool {
			ns := eventNs(l)
			return len(ns) > 0 && ns[len(ns)-1] == published-1
		})
		got := c.events()
		for i := 1; i < len(got); i++ {
			if got[i] <= got[i-1] {
				t.Fatalf("events out of order or twice at %d: %v", i, got[max(0, i-3):min(len(got), i+3)])
			}
		}
		if len(got) >= published {
			t.Fatalf("got %d events of %d with the node down for a while: the gap is not real", len(got), published)
		}
		for _, l := range c.all() {
			if l.K == "gap" && l.Reason != "reconnect" {
				t.Fatalf("gap %+v, want reason reconnect", l)
			}
		}
	})

	t.Run("resubscribes paced under the rate limit", func(t *testing.T) {
		newNATS(t)
		n := startGateway(t, bin, jsNodeArgs(url, "NODERATE")...)
		const subs = 250
		var list []map[string]any
		for i := range subs {
			list = append(list, map[string]any{"pattern": "app.s" + strconv.Itoa(i), "from": "first"})
		}
		// A client that sends as fast as it can: the gateway (100 messages
		// per second, burst 200) drops some subscribes with rate_limited,
		// and the client sends those again.
		c := runClient(t, node, map[string]any{"urls": []string{n.wsURL()}, "subs": list,
			"options": map[string]any{"messageRate": 0, "messageBurst": 1e9}}, nil)
		c.waitFor("connected", clientWait, func(l []jsLine) bool { return count(l, "state", "connected") > 0 })
		time.Sleep(500 * time.Millisecond)
		n.stop(syscall.SIGKILL)
		for i := range subs {
			if _, err := js.Publish(context.Background(), "app.s"+strconv.Itoa(i), fmt.Appendf(nil, `{"n":%d}`, i)); err != nil {
				t.Fatal(err)
			}
		}
		n.start()
		c.waitEvents(subs, clientWait)
		time.Sleep(200 * time.Millisecond)
		got := map[string]int{}
		for _, l := range c.all() {
			switch l.K {
			case "event":
				if want := "s" + strconv.Itoa(l.Data.N+1); l.Sub != want {
					t.Fatalf("event %d went to %s, want %s", l.Data.N, l.Sub, want)
				}
				got[l.Sub]++
			case "error":
				t.Fatalf("the client reported %+v: a rate_limited subscribe must be sent again, not surface", l)
			}
		}
		if len(got) != subs {
			t.Fatalf("%d subscriptions got their event, want %d", len(got), subs)
		}
		for id, k := range got {
			if k != 1 {
				t.Fatalf("%s got %d events, want 1", id, k)
			}
		}
		// The gateway did drop subscribes: the retry path ran.
		if limited := nodeMetric(t, n, `fanwire_client_errors_total{code="rate_limited"}`); limited == 0 {
			t.Fatal("no rate_limited at the gateway: the test did not exercise the resubscribe pacing")
		}
	})
}

// publishN publishes {"n":from} ... {"n":to-1} to app.<n mod 4>, each stored.
func publishN(t *testing.T, js jetstream.JetStream, from, to int) {
	t.Helper()
	for i := from; i < to; i++ {
		if _, err := js.Publish(context.Background(), "app."+strconv.Itoa(i%4), fmt.Appendf(nil, `{"n":%d}`, i)); err != nil {
			t.Fatal(err)
		}
	}
}

// nodeMetric reads one sample (name with its labels, as /metrics prints
// it) from n's /metrics; 0 when absent.
func nodeMetric(t *testing.T, n *gwNode, sample string) float64 {
	t.Helper()
	resp, err := http.Get(n.httpURL() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(body), "\n") {
		if v, ok := strings.CutPrefix(line, sample+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil {
				t.Fatal(err)
			}
			return f
		}
	}
	return 0
}

// TestClientTypes type-checks an example app against fanwire.d.ts with
// tsc --noEmit (strict).
func TestClientTypes(t *testing.T) {
	t.Parallel() // it mostly waits for its own processes (Node, Chromium, nodes): beside the others
	node := requireClientFixture(t)
	tsc := filepath.Join("node_modules", "typescript", "bin", "tsc")
	cmd := exec.Command(node, tsc, "--noEmit", "-p", "tsconfig.json")
	cmd.Dir = clientFixture
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("tsc --noEmit: %v\n%s", err, out)
	}
	// And it does check: every line of an example that misuses the API fails.
	misuses := []struct{ line, why string }{
		{`c.subscribe("a.>", {from: 7}, (e) => e.data);`, "from: 7"},
		{`c.on("nonsense", () => {});`, `on("nonsense")`},
		{`c.subscribe("a.>", {buffer: "50"});`, `buffer: "50"`},
		{`c.subscribe("a.>", {signal: "stop"});`, `signal: "stop"`},
		{`void c.publish("a.b", 1, {timeout: "1s"});`, `publish's timeout: "1s"`},
		{`connect("ws://x/ws", {getToken: () => 42});`, "getToken giving a number"},
		{`c.subscribe<{n: number}>("a.>").on("nonsense", () => {});`, `sub.on("nonsense")`},
		{`void new FanwireError("no message");`, "FanwireError without a message"},
		{`void (async () => { for await (const ev of c.subscribe<{n: number}>("a.>")) { const s: string = ev.data.n; void s; } })();`, "an iterated event's data of the wrong type"},
		{`void c.ready("soon");`, `ready("soon")`},
	}
	src := `import {connect, FanwireError} from "` + absPath(t, "client/fanwire.js") + `";
const c = connect("ws://x/ws");
`
	for _, m := range misuses {
		src += m.line + "\n"
	}
	bad := filepath.Join(t.TempDir(), "bad.ts")
	if err := os.WriteFile(bad, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd = exec.Command(node, tsc, "--noEmit", "--strict", "--module", "NodeNext", "--moduleResolution", "NodeNext", "--target", "ES2022", "--types", "node", bad)
	cmd.Dir = clientFixture
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("tsc accepted a misuse of the API:\n%s", src)
	}
	for i, m := range misuses {
		if !strings.Contains(string(out), fmt.Sprintf("bad.ts(%d,", i+3)) {
			t.Errorf("tsc let %s through (line %d: %s):\n%s", m.why, i+3, m.line, out)
		}
	}
}

func absPath(t *testing.T, p string) string {
	t.Helper()
	a, err := filepath.Abs(p)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// TestClientBrowser: the same failovers in a real Chromium, on a page of
// another origin that imports /fanwire.js from the gateway itself.
func TestClientBrowser(t *testing.T) {
	t.Parallel() // it mostly waits for its own processes (Node, Chromium, nodes): beside the others
	requireClientFixture(t)
	bin := buildFanwire(t)
	pages := httptest.NewServer(http.FileServer(http.Dir(clientFixture)))
	t.Cleanup(pages.Close)
	browser := browsertest.Start(t) // closed before the servers: cleanups run last-in first-out

	for i, f := range failovers {
		t.Run(f.name, func(t *testing.T) {
			url := brokertest.NATS(t).ClientURL()
			js := brokertest.JetStream(t, url)
			var nodes []*gwNode
			var urls []string
			for range f.nodes {
				n := startGateway(t, bin, jsNodeArgs(url, "PAGE"+strconv.Itoa(i))...)
				nodes = append(nodes, n)
				urls = append(urls, n.wsURL())
			}
			p := openTab(t, browser, clientPageState)
			p.Do(chromedp.Navigate(pages.URL + "/page.html?" + neturl.Values{
				"gw": {nodes[0].httpURL()}, "urls": {strings.Join(urls, ",")}, "pattern": {"app.>"}, "from": {"first"},
			}.Encode()))
			p.WaitVisible(`#status[data-state="connected"]`)
			pub := startPublisher(t, jsPublish(js), publishEvery)
			waitPage(t, p, "100 events", func(fw clientPage) bool { return len(fw.Events) >= 100 })
			f.act(nodes)
			var before int
			waitPage(t, p, "a reconnect", func(fw clientPage) bool { before = len(fw.Events); return fw.reconnected() })
			waitPage(t, p, "100 events more", func(fw clientPage) bool { return len(fw.Events) >= before+100 })
			n := pub.stop()
			if pub.err != nil {
				t.Fatalf("publishing: %v", pub.err)
			}
			var fw clientPage
			waitPage(t, p, strconv.Itoa(n)+" events", func(got clientPage) bool { fw = got; return len(got.Events) >= n })
			checkSequence(t, fw.Events, n)
			if len(fw.Errors) > 0 {
				t.Fatalf("the page reported errors: %+v", fw.Errors)
			}
			if f.nodes == 2 && fw.States[len(fw.States)-1].URL != nodes[1].wsURL() {
				t.Fatalf("the page ended on %+v, want the surviving node %s", fw.States[len(fw.States)-1], nodes[1].wsURL())
			}
		})
	}
}

// clientPageState describes page.html for a failure.
const clientPageState = `JSON.stringify({status: document.getElementById("status").textContent, states: window.fw && fw.states,
	gaps: window.fw && fw.gaps, errors: window.fw && fw.errors, events: window.fw && fw.events.length})`

// clientPage is what page.html keeps in window.fw.
type clientPage struct {
	States []struct {
		State string  `json:"state"`
		Code  int     `json:"code"`
		URL   string  `json:"url"`
		At    float64 `json:"at"`
	} `json:"states"`
	Events []int            `json:"events"`
	Gaps   []map[string]any `json:"gaps"`
	Errors []map[string]any `json:"errors"`
}

// reconnected reports whether the page was connected, lost it and is
// connected again.
func (fw clientPage) reconnected() bool {
	seen := 0
	for _, s := range fw.States {
		if s.State == "disconnected" && seen == 0 {
			seen = 1
		}
		if s.State == "connected" && seen == 1 {
			return true
		}
	}
	return false
}

// waitPage polls the page's window.fw until cond holds, within the tab's
// step budget.
func waitPage(t testing.TB, p *browsertest.Page, what string, cond func(clientPage) bool) {
	t.Helper()
	for {
		fw, err := chromedp.Run(p.Context(), chromedp.Evaluate[clientPage](`window.fw`))
		if err != nil {
			p.Fatal(fmt.Errorf("waiting for %s: %w", what, err))
		}
		if cond(fw) {
			return
		}
		select {
		case <-p.Context().Done():
			p.Fatal(fmt.Errorf("waiting for %s: %w", what, p.Context().Err()))
		case <-time.After(50 * time.Millisecond):
		}
	}
}
