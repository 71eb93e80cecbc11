package gateway_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/fanwire/fanwire/gateway"
)

func TestSubscribeReceiveUnsubscribe(t *testing.T) {
	e := newEnv(t, nil)
	cl := e.dial()
	cl.subscribe("s1", "orders.*")
	e.publish("orders.42", `{"id":42, "total": 9.5}`)
	got := cl.nextRaw()
	// The data is compacted and spliced verbatim into the envelope.
	want := `{"type":"event","subject":"orders.42","subs":["s1"],"data":{"id":42,"total":9.5}}`
	if got != want {
		t.Fatalf("event\n got %s\nwant %s", got, want)
	}
	e.publish("customers.1", `{}`) // not matched
	cl.send(`{"type":"unsubscribe","id":"s1"}`)
	cl.expect(map[string]any{"type": "unsubscribed", "id": "s1"})
	e.publish("orders.43", `{"id":43}`)
	cl.send(`{"type":"ping"}`)
	cl.expect(map[string]any{"type": "pong"}) // and no event before it
}

func TestOneDeliveryListsEveryMatchingSubscription(t *testing.T) {
	e := newEnv(t, nil)
	cl := e.dial()
	cl.subscribe("s1", "orders.*")
	cl.subscribe("s2", "customers.>")
	cl.subscribe("s3", "orders.42")
	cl.subscribe("s4", ">")
	e.publish("orders.42", `1`)
	cl.expect(map[string]any{"type": "event", "subject": "orders.42", "subs": []string{"s1", "s3", "s4"}, "data": 1})
	e.publish("orders.7", `2`)
	cl.expect(map[string]any{"type": "event", "subject": "orders.7", "subs": []string{"s1", "s4"}, "data": 2})
	cl.send(`{"type":"unsubscribe","id":"s4"}`)
	cl.expect(map[string]any{"type": "unsubscribed"})
	e.publish("orders.42", `3`)
	cl.expect(map[string]any{"type": "event", "subs": []string{"s1", "s3"}, "data": 3})
	e.publish("customers.1.address", `4`)
	cl.expect(map[string]any{"type": "event", "subs": []string{"s2"}, "data": 4})
}

func TestManyClientsEachGetEveryEventInOrder(t *testing.T) {
	e := newEnv(t, nil)
	const clients, events = 20, 500
	cls := make([]*client, clients)
	for i := range cls {
		cls[i] = e.dial()
		cls[i].subscribe("a", "feed."+strconv.Itoa(i%2)+".*")
	}
	for i := range events {
		if err := e.nc.Publish("feed."+strconv.Itoa(i%2)+".x", []byte(strconv.Itoa(i))); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	for ci, cl := range cls {
		for i := ci % 2; i < events; i += 2 {
			cl.expect(map[string]any{"type": "event", "data": i})
		}
	}
}

func TestProtocolErrorsKeepTheConnection(t *testing.T) {
	e := newEnv(t, func(c *gateway.Config) {
		c.MaxSubscriptions = 2
		c.Subjects = []string{"orders.>", "app.>"}
	})
	cl := e.dial()
	cases := []struct {
		frame, code, id string
	}{
		{`not json`, "bad_frame", ""},
		{`[1,2]`, "bad_frame", ""},
		{`{"type":"subscribe","id":"s1","subject":"orders.*"} {}`, "bad_frame", ""},
		{`{"type":"subscribe","id":"s1","subject":"orders.*","extra":1}`, "bad_frame", ""},
		{`{"type":"subscribe","id":5,"subject":"orders.*"}`, "bad_frame", ""},
		{`{"type":"subscribe","subject":"orders.*"}`, "bad_frame", ""},
		{`{"type":"subscribe","id":"s1"}`, "bad_frame", "s1"},
		{`{"id":"s1"}`, "bad_frame", "s1"},
		{`{"type":"publish","id":"s1"}`, "bad_frame", "s1"}, // no subject, no data
		{`{"type":"send","id":"s1"}`, "unknown_type", "s1"},
		{`{"type":"ping","id":"p"}`, "bad_frame", "p"},
		{`{"type":"subscribe","id":"s1","subject":"orders..x"}`, "bad_pattern", "s1"},
		{`{"type":"subscribe","id":"s1","subject":"orders.>.x"}`, "bad_pattern", "s1"},
		{`{"type":"subscribe","id":"s1","subject":"orders.a*"}`, "bad_pattern", "s1"},
		{`{"type":"subscribe","id":"s1","subject":"customers.*"}`, "bad_pattern", "s1"}, // outside the subject space
		{`{"type":"unsubscribe","id":"nope"}`, "unknown_id", "nope"},
		{`{"type":"refresh","id":"r1","token":"t"}`, "unauthorized", "r1"}, // no authentication: nothing to refresh
		{`{"type":"refresh","id":"r1"}`, "bad_frame", "r1"},
	}
	for _, tc := range cases {
		cl.send(tc.frame)
		m := cl.expect(map[string]any{"type": "error", "code": tc.code})
		if tc.id != "" && m["id"] != tc.id {
			t.Errorf("%s: id = %v, want %s", tc.frame, m["id"], tc.id)
		}
		if msg, _ := m["message"].(string); msg == "" {
			t.Errorf("%s: error without a message", tc.frame)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := cl.c.Write(ctx, websocket.MessageBinary, []byte(`{"type":"ping"}`)); err != nil {
		t.Fatal(err)
	}
	cl.expect(map[string]any{"type": "error", "code": "bad_frame"})

	cl.subscribe("s1", "orders.*")
	cl.send(`{"type":"subscribe","id":"s1","subject":"orders.>"}`)
	cl.expect(map[string]any{"type": "error", "code": "duplicate_id", "id": "s1"})
	cl.subscribe("s2", ">") // intersects the subject space
	cl.send(`{"type":"subscribe","id":"s3","subject":"app.x"}`)
	cl.expect(map[string]any{"type": "error", "code": "too_many_subscriptions", "id": "s3"})

	// After all that, the connection still works.
	e.publish("orders.1", `{"ok":true}`)
	cl.expect(map[string]any{"type": "event", "subs": []string{"s1", "s2"}})
	if n := e.metric("fanwire_client_errors_total", map[string]string{"code": "bad_pattern"}); n != 4 {
		t.Errorf("bad_pattern errors counted %v, want 4", n)
	}
}

func TestRepeatedAbuseClosesWithPolicy(t *testing.T) {
	e := newEnv(t, func(c *gateway.Config) { c.MaxClientErrors = 5 })
	cl := e.dial()
	for range 6 {
		cl.send(`nonsense`)
	}
	if code := cl.closeStatus(5 * time.Second); code != websocket.StatusPolicyViolation {
		t.Fatalf("close code %v, want 1008", code)
	}
	waitFor(t, "policy disconnect counted", func() bool {
		return e.metric("fanwire_disconnects_total", map[string]string{"reason": "policy"}) == 1
	})
}

func TestOversizedFrameClosesWith1009(t *testing.T) {
	e := newEnv(t, nil)
	cl := e.dial()
	big := `{"type":"subscribe","id":"` + strings.Repeat("x", 70<<10) + `","subject":"a"}`
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	// The write may fail: the server closes as soon as the frame's header
	// says it is too big, while the rest is still being sent. The close
	// frame arrives first all the same.
	_ = cl.c.Write(ctx, websocket.MessageText, []byte(big))
	if code := cl.closeStatus(5 * time.Second); code != websocket.StatusMessageTooBig {
		t.Fatalf("close code %v, want 1009", code)
	}
	waitFor(t, "read_limit disconnect counted", func() bool {
		return e.metric("fanwire_disconnects_total", map[string]string{"reason": "read_limit"}) == 1
	})
}

func TestSlowConsumerIsClosedWith4008WhileOthersGetEverything(t *testing.T) {
	e := newEnv(t, func(c *gateway.Config) {
		c.MailboxMessages = 1024
		// The slow client reads only at the end: its close frame must wait
		// for it rather than be cut.
		c.CloseTimeout = time.Minute
	})
	slow := e.dial()
	slow.subscribe("s", "bulk.*")
	good := e.dial()
	good.subscribe("g", "bulk.*")

	// 8,000 events of 4 KiB (32 MiB): far more than the socket buffers and
	// a 1,024-message mailbox hold while the slow client reads nothing. They
	// are published in steps the good client keeps up with.
	pad := strings.Repeat("x", 4<<10)
	const n, step = 8000, 200
	for i := 0; i < n; i += step {
		for j := i; j < i+step; j++ {
			if err := e.nc.Publish("bulk.x", []byte(`{"i":`+strconv.Itoa(j)+`,"pad":"`+pad+`"}`)); err != nil {
				t.Fatal(err)
			}
		}
		if err := e.nc.Flush(); err != nil {
			t.Fatal(err)
		}
		for j := i; j < i+step; j++ {
			m := good.next()
			if m["type"] != "event" || m["data"].(map[string]any)["i"] != float64(j) {
				t.Fatalf("good client: message %d is %v", j, m["type"])
			}
		}
	}
	// The slow client now reads: what was queued before the overflow, then
	// the 4008 close.
	if code := slow.closeStatus(10 * time.Second); code != gateway.CloseSlowConsumer {
		t.Fatalf("slow client close code %v, want 4008", code)
	}
	waitFor(t, "slow_consumer counted", func() bool {
		return e.metric("fanwire_disconnects_total", map[string]string{"reason": "slow_consumer"}) == 1
	})
}

func TestGracefulShutdownSends1001AfterQueuedEvents(t *testing.T) {
	if testing.Short() {
		t.Skip("-short (make test-quick) leaves out the slow tests: make test runs them")
	}
	e := newEnv(t, nil)
	cl := e.dial()
	cl.subscribe("s", "x")
	e.publish("x", `"last"`)
	cl.expect(map[string]any{"type": "event", "data": "last"})
	e.stop()
	if code := cl.closeStatus(5 * time.Second); code != websocket.StatusGoingAway {
		t.Fatalf("close code %v, want 1001", code)
	}
	// New connections are refused while and after draining.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if _, _, err := websocket.Dial(ctx, e.wsURL(), nil); err == nil {
		t.Fatal("dial after shutdown succeeded")
	}
}

func TestNonJSONBrokerMessageIsCountedAndSkipped(t *testing.T) {
	e := newEnv(t, nil)
	cl := e.dial()
	cl.subscribe("s", "m.*")
	e.publish("m.bad", "not json at all")
	e.publish("m.bad", `{"truncated":`)
	e.publish("m.good", `{"ok":true}`)
	waitFor(t, "three events received", func() bool { return e.metric("fanwire_events_received_total", nil) == 3 })
	cl.expect(map[string]any{"type": "event", "subject": "m.good"})
	if n := e.metric("fanwire_events_invalid_total", nil); n != 2 {
		t.Fatalf("invalid events counted %v, want 2", n)
	}
}

func TestMaxConnectionsGets503(t *testing.T) {
	e := newEnv(t, func(c *gateway.Config) { c.MaxConnections = 1 })
	e.dial()
	resp, err := http.Get(e.http.URL + "/ws")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("status %d Retry-After %q, want 503 with Retry-After", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	if !strings.Contains(string(body), "max_connections") {
		t.Fatalf("body %s does not name the limit", body)
	}
}

func TestHealthReadyMetrics(t *testing.T) {
	e := newEnv(t, nil)
	for path, want := range map[string]int{"/healthz": 200, "/readyz": 200, "/metrics": 200, "/": 200} {
		resp, err := http.Get(e.http.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("GET %s: %d, want %d: %s", path, resp.StatusCode, want, b)
		}
		if path == "/metrics" && !strings.Contains(string(b), "fanwire_deliveries_total") {
			t.Errorf("/metrics lacks fanwire_deliveries_total")
		}
	}
	// Not ready while the broker is down.
	e.ns.Shutdown()
	waitFor(t, "readyz to fail", func() bool {
		resp, err := http.Get(e.http.URL + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusServiceUnavailable
	})
}

func TestPublishAPI(t *testing.T) {
	e := newEnv(t, func(c *gateway.Config) {
		c.APIKey = "sekret"
		c.Subjects = []string{"orders.>", "app.>"}
	})
	cl := e.dial()
	cl.subscribe("s", "orders.*")
	post := func(body, key, ctype string) (int, map[string]any) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, e.http.URL+"/api/publish", strings.NewReader(body))
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		if ctype != "" {
			req.Header.Set("Content-Type", ctype)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var m map[string]any
		b, _ := io.ReadAll(resp.Body)
		if err := jsonUnmarshal(b, &m); err != nil {
			t.Fatalf("response %q is not JSON: %v", b, err)
		}
		return resp.StatusCode, m
	}
	cases := []struct {
		name, body, key, ctype string
		status                 int
		code, field            string
	}{
		{"no key", `{"subject":"orders.1","data":{}}`, "", "", 401, "unauthorized", ""},
		{"wrong key", `{"subject":"orders.1","data":{}}`, "nope", "", 401, "unauthorized", ""},
		{"empty", ``, "sekret", "", 400, "bad_request", ""},
		{"not json", `{"subject":`, "sekret", "", 400, "bad_request", ""},
		{"unknown field", `{"subject":"orders.1","data":{},"x":1}`, "sekret", "", 400, "bad_request", ""},
		{"missing subject", `{"data":{}}`, "sekret", "", 400, "bad_request", "subject"},
		{"missing data", `{"subject":"orders.1"}`, "sekret", "", 400, "bad_request", "data"},
		{"wildcard", `{"subject":"orders.*","data":{}}`, "sekret", "", 400, "bad_subject", "subject"},
		{"bad subject", `{"subject":"orders..1","data":{}}`, "sekret", "", 400, "bad_subject", "subject"},
		{"outside space", `{"subject":"users.1","data":{}}`, "sekret", "", 400, "bad_subject", "subject"},
		{"empty array", `[]`, "sekret", "", 400, "bad_request", ""},
		{"bad element", `[{"subject":"orders.1","data":1},{"subject":"orders.2"}]`, "sekret", "", 400, "bad_request", "data"},
	}
	for _, tc := range cases {
		status, m := post(tc.body, tc.key, tc.ctype)
		if status != tc.status || m["code"] != tc.code {
			t.Errorf("%s: %d %v, want %d %s", tc.name, status, m, tc.status, tc.code)
		}
		if tc.field != "" && m["field"] != tc.field {
			t.Errorf("%s: field %v, want %s", tc.name, m["field"], tc.field)
		}
		if msg, _ := m["error"].(string); msg == "" {
			t.Errorf("%s: no error message", tc.name)
		}
	}
	cl.quiet() // nothing was published by the bad requests
	if status, m := post(`{"subject":"orders.1","data":{"n": 1}}`, "sekret", "application/json"); status != 200 || m["published"] != float64(1) {
		t.Fatalf("publish: %d %v", status, m)
	}
	cl.expect(map[string]any{"type": "event", "subject": "orders.1", "data": map[string]any{"n": 1}})
	if status, m := post(`[{"subject":"orders.2","data":2},{"subject":"orders.3","data":[3]}]`, "sekret", ""); status != 200 || m["published"] != float64(2) {
		t.Fatalf("publish array: %d %v", status, m)
	}
	cl.expect(map[string]any{"subject": "orders.2", "data": 2})
	cl.expect(map[string]any{"subject": "orders.3", "data": []int{3}})
	// curl -d sends form encoding: the body is JSON all the same.
	if status, m := post(`{"subject":"orders.4","data":4}`, "sekret", "application/x-www-form-urlencoded"); status != 200 {
		t.Fatalf("publish as curl -d: %d %v", status, m)
	}
	cl.expect(map[string]any{"subject": "orders.4", "data": 4})

	// A cross-origin browser POST (no preflight for text/plain) is refused.
	req, _ := http.NewRequest(http.MethodPost, e.http.URL+"/api/publish", strings.NewReader(`{"subject":"orders.5","data":5}`))
	req.Header.Set("Authorization", "Bearer sekret")
	req.Header.Set("Content-Type", "text/plain")
	req.Header.Set("Origin", "https://evil.example.net")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Fatalf("cross-origin publish: %d, want 403", resp.StatusCode)
	}
	cl.quiet()
}

func TestConcurrentSubscribeDuringDispatch(t *testing.T) {
	e := newEnv(t, nil)
	watcher := e.dial()
	watcher.subscribe("w", "churn.>")
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			cl := e.dial()
			for j := range 50 {
				id := fmt.Sprintf("s%d", j)
				cl.subscribe(id, fmt.Sprintf("churn.%d.*", i))
				cl.send(`{"type":"unsubscribe","id":"` + id + `"}`)
				for {
					if m := cl.next(); m["type"] == "unsubscribed" {
						break
					}
				}
			}
		})
	}
	const n = 2000
	for i := range n {
		if err := e.nc.Publish(fmt.Sprintf("churn.%d.x", i%8), []byte(strconv.Itoa(i))); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	for i := range n {
		watcher.expect(map[string]any{"type": "event", "data": i})
	}
}

func TestBrowserOriginsSameOriginByDefault(t *testing.T) {
	e := newEnv(t, func(c *gateway.Config) { c.AllowedOrigins = []string{"app.example.com"} })
	dial := func(origin string) (int, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		h := http.Header{}
		h.Set("Origin", origin)
		c, resp, err := websocket.Dial(ctx, e.wsURL(), &websocket.DialOptions{HTTPHeader: h})
		if err == nil {
			c.CloseNow()
			return resp.StatusCode, nil
		}
		if resp != nil {
			return resp.StatusCode, err
		}
		return 0, err
	}
	if code, err := dial("https://evil.example.net"); err == nil || code != http.StatusForbidden {
		t.Errorf("foreign origin: status %d, err %v; want 403", code, err)
	}
	if _, err := dial("https://app.example.com"); err != nil {
		t.Errorf("allowed origin refused: %v", err)
	}
	if _, err := dial(e.http.URL); err != nil { // same origin
		t.Errorf("same origin refused: %v", err)
	}
}

func TestPublishBodyTooLarge(t *testing.T) {
	e := newEnv(t, func(c *gateway.Config) { c.MaxPublishBytes = 1024; c.AllowAnonymousPublish = true })
	body := `{"subject":"a","data":"` + strings.Repeat("x", 2048) + `"}`
	resp, err := http.Post(e.http.URL+"/api/publish", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestEntityTooLarge || !strings.Contains(string(b), "too_large") {
		t.Fatalf("status %d %s, want 413 too_large", resp.StatusCode, b)
	}
	if n := e.metric("fanwire_publish_requests_total", map[string]string{"result": "too_large"}); n != 1 {
		t.Fatalf(`fanwire_publish_requests_total{result="too_large"} = %v, want 1`, n)
	}
}

// TestUnansweredPingCloses uses a client that never reads, so it never
// answers the server's pings: the server must close it and count why.
func TestUnansweredPingCloses(t *testing.T) {
	e := newEnv(t, func(c *gateway.Config) {
		c.PingInterval = 50 * time.Millisecond
		c.PingTimeout = 100 * time.Millisecond
	})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, _, err := websocket.Dial(ctx, e.wsURL(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	waitFor(t, "ping_timeout disconnect", func() bool {
		return e.metric("fanwire_disconnects_total", map[string]string{"reason": "ping_timeout"}) == 1
	})
	// A client that keeps reading answers pings and stays: the event is
	// published after several ping intervals, while the client waits in a
	// read.
	cl := e.dial()
	cl.subscribe("s", "still.here")
	published := make(chan error, 1)
	time.AfterFunc(300*time.Millisecond, func() {
		err := e.nc.Publish("still.here", []byte(`1`))
		if err == nil {
			err = e.nc.Flush()
		}
		published <- err
	})
	cl.expect(map[string]any{"type": "event", "data": 1})
	if err := <-published; err != nil {
		t.Fatal(err)
	}
	if n := e.metric("fanwire_disconnects_total", map[string]string{"reason": "ping_timeout"}); n != 1 {
		t.Fatalf("%v ping timeouts, want only the silent client's", n)
	}
}

// TestDurableEventsCarryCursors runs the gateway on each durable broker:
// events carry the broker's position as their cursor, the publish API
// returns the cursors of what it stored, and a publish "id" seen before
// (in the same request or a later one) is stored once and answered with
// the original cursor.
func TestDurableEventsCarryCursors(t *testing.T) {
	for _, kind := range []string{"jetstream", "redis", "redis-cluster"} {
		t.Run(kind, func(t *testing.T) {
			e := newEnvOn(t, kind, func(c *gateway.Config) {
				c.Subjects = []string{"orders.>", "app.>"}
				c.AllowAnonymousPublish = true
			})
			cl := e.dial()
			cl.subscribe("s", "orders.*")
			publish := func(body string) []string {
				t.Helper()
				resp, err := http.Post(e.http.URL+"/api/publish", "application/json", strings.NewReader(body))
				if err != nil {
					t.Fatal(err)
				}
				defer resp.Body.Close()
				var pub struct {
					Published int      `json:"published"`
					Cursors   []string `json:"cursors"`
				}
				if err := jsonDecode(resp.Body, &pub); err != nil || resp.StatusCode != http.StatusOK {
					t.Fatalf("publish %s: %d %v", body, resp.StatusCode, err)
				}
				return pub.Cursors
			}
			cursors := publish(`[{"subject":"orders.1","data":1,"id":"a"},{"subject":"orders.2","data":2,"id":"b"},{"subject":"orders.1","data":1,"id":"a"}]`)
			if len(cursors) != 3 || cursors[2] != cursors[0] || cursors[1] == cursors[0] {
				t.Fatalf("publish with a repeated id: cursors %v, want two distinct, then the first again", cursors)
			}
			got := cl.nextRaw()
			want := `{"type":"event","subject":"orders.1","cursor":"` + cursors[0] + `","subs":["s"],"data":1}`
			if got != want {
				t.Fatalf("event\n got %s\nwant %s", got, want)
			}
			cl.expect(map[string]any{"type": "event", "cursor": cursors[1], "data": 2})
			// Publishing the same id again is deduplicated by the broker.
			if again := publish(`{"subject":"orders.1","data":1,"id":"a"}`); len(again) != 1 || again[0] != cursors[0] {
				t.Fatalf("duplicate publish: cursors %v, want the original %s", again, cursors[0])
			}
			cl.quiet()
		})
	}
}

// TestBrokerEventOverMailboxBytes: an event from the broker (published by
// another, e.g. the ingest) that could never fit in a mailbox is delivered
// to nobody and counted; before, every subscriber was closed with 4008.
// So is, to a client, an event that fits but not with that client's
// subscription list.
func TestBrokerEventOverMailboxBytes(t *testing.T) {
	e := newEnv(t, func(c *gateway.Config) { c.MailboxBytes, c.MaxPublishBytes = 4096, 4096 })
	watcher := e.dial()
	watcher.subscribe("w", ">")
	e.publish("big.one", `"`+strings.Repeat("x", 5000)+`"`)
	e.publish("edge.one", `"`+strings.Repeat("x", 4039)+`"`) // a 4,094-byte event, 4,099 with ["w"]
	e.publish("small", `1`)
	watcher.expect(map[string]any{"type": "event", "subject": "small"})
	watcher.quiet()
	if n := e.metric("fanwire_events_dropped_total", map[string]string{"reason": "too_large"}); n != 1 {
		t.Errorf(`fanwire_events_dropped_total{reason="too_large"} = %v, want 1`, n)
	}
	if n := e.metric("fanwire_slow_consumers_total", nil); n != 0 {
		t.Errorf("fanwire_slow_consumers_total = %v, want 0", n)
	}
}

// TestMailboxBytesBelowPublishLimit: a configuration where a publish the
// gateway accepts could not fit in a mailbox is refused, naming both flags.
// The broker's own limit counts when it is the smaller (NATS: 1 MiB).
func TestMailboxBytesBelowPublishLimit(t *testing.T) {
	e := newEnv(t, nil)
	_, err := gateway.New(gateway.Config{Broker: e.b, MailboxBytes: 64 << 10, MaxPublishBytes: 128 << 10})
	if err == nil || !strings.Contains(err.Error(), "--mailbox-bytes") || !strings.Contains(err.Error(), "--max-publish-bytes") {
		t.Fatalf("MailboxBytes under MaxPublishBytes: %v, want an error naming --mailbox-bytes and --max-publish-bytes", err)
	}
	if _, err := gateway.New(gateway.Config{Broker: e.b, MailboxBytes: 128 << 10, MaxPublishBytes: 128 << 10}); err != nil {
		t.Errorf("MailboxBytes = MaxPublishBytes: %v", err)
	}
	if _, err := gateway.New(gateway.Config{Broker: e.b, MailboxBytes: 2 << 20, MaxPublishBytes: 8 << 20}); err != nil {
		t.Errorf("MailboxBytes over the broker's 1 MiB limit, under MaxPublishBytes: %v", err)
	}
	if _, err := gateway.New(gateway.Config{Broker: e.b}); err != nil {
		t.Errorf("defaults: %v", err)
	}
}
