package gateway_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/fanwire/fanwire/broker"
	"github.com/fanwire/fanwire/broker/brokertest"
	"github.com/fanwire/fanwire/gateway"
)

func jsEnv(t *testing.T, jsMutate func(*broker.JetStreamConfig)) *env {
	return newEnvJS(t, "jetstream", jsMutate, func(c *gateway.Config) { c.Subjects = []string{"orders.>", "app.>"} })
}

// publishN publishes events whose data is their number, first..first+n-1,
// through the broker: on JetStream it returns once they are stored.
func (e *env) publishN(subject string, first, n int) {
	e.t.Helper()
	var out []broker.Outgoing
	for i := first; i < first+n; i++ {
		out = append(out, broker.Outgoing{Subject: subject, Data: []byte(strconv.Itoa(i))})
	}
	if _, err := e.b.Publish(context.Background(), out); err != nil {
		e.t.Error(err)
	}
}

// TestResumeHandsOverWithoutGapOrDuplicate replays from a cursor while
// events keep being published, repeatedly: every client must see exactly
// the events after its cursor, once each, in order, across the hand-over
// from replay to live.
func TestResumeHandsOverWithoutGapOrDuplicate(t *testing.T) {
	e := jsEnv(t, nil)
	e.publishN("orders.x", 1, 300) // stream sequences 1..300
	const total = 1500
	var wg sync.WaitGroup
	wg.Go(func() { e.publishN("orders.x", 301, total-300) })
	for round, from := range []int{0, 50, 150, 299} {
		cl := e.dial()
		id := fmt.Sprint("r", round)
		cl.send(`{"type":"subscribe","id":"` + id + `","subject":"orders.*","from":"js:` + strconv.Itoa(from) + `"}`)
		m := cl.next()
		if from == 0 {
			// js:0 is not a cursor
			if m["type"] != "error" || m["code"] != "bad_cursor" {
				t.Fatalf("from js:0: %v, want bad_cursor", m)
			}
			cl.send(`{"type":"subscribe","id":"` + id + `","subject":"orders.*","from":"first"}`)
			m = cl.next()
		}
		if m["type"] != "subscribed" {
			t.Fatalf("round %d: first reply %v", round, m)
		}
		for want := from + 1; want <= total; want++ {
			m := cl.next()
			if m["type"] != "event" || m["data"] != float64(want) || m["cursor"] != "js:"+strconv.Itoa(want) {
				t.Fatalf("round %d (from %d): got %v, want event %d", round, from, m, want)
			}
		}
		cl.quiet() // and nothing after
	}
	wg.Wait()
}

func TestResumeErrorsKeepTheConnection(t *testing.T) {
	e := jsEnv(t, nil)
	e.publishN("orders.x", 1, 10)
	cl := e.dial()
	for _, from := range []string{"nope", "rs:1-0", "js:-1", "js:99999"} {
		cl.send(`{"type":"subscribe","id":"s","subject":"orders.*","from":"` + from + `"}`)
		m := cl.expect(map[string]any{"type": "error", "code": "bad_cursor", "id": "s"})
		if msg, _ := m["message"].(string); !strings.Contains(msg, "cursor") {
			t.Errorf("from %q: message %q", from, msg)
		}
	}
	// The id is free again and the connection works.
	cl.send(`{"type":"subscribe","id":"s","subject":"orders.*","from":"js:8"}`)
	cl.expect(map[string]any{"type": "subscribed", "id": "s", "cursor": "js:8"})
	cl.expect(map[string]any{"type": "event", "cursor": "js:9"})
	cl.expect(map[string]any{"type": "event", "cursor": "js:10"})
	e.publishN("orders.y", 11, 1)
	cl.expect(map[string]any{"type": "event", "cursor": "js:11", "data": 11})
}

func TestResumeExpiredCursor(t *testing.T) {
	e := jsEnv(t, func(c *broker.JetStreamConfig) { c.MaxBytes = 4096 })
	for i := range 100 {
		if _, err := e.b.Publish(context.Background(), []broker.Outgoing{{Subject: "orders.x", Data: []byte(`{"i":` + strconv.Itoa(i) + `,"pad":"` + strings.Repeat("p", 100) + `"}`)}}); err != nil {
			t.Fatal(err)
		}
	}
	cl := e.dial()
	cl.send(`{"type":"subscribe","id":"s","subject":"orders.*","from":"js:1"}`)
	cl.expect(map[string]any{"type": "error", "code": "cursor_expired", "id": "s"})
	cl.quiet()
}

func TestResumeOnCoreNATSIsABadCursor(t *testing.T) {
	e := newEnv(t, nil)
	cl := e.dial()
	cl.send(`{"type":"subscribe","id":"s","subject":"orders.*","from":"first"}`)
	cl.expect(map[string]any{"type": "error", "code": "bad_cursor", "id": "s"})
	cl.subscribe("s", "orders.*") // the id is free
}

func TestLiveSubscribeOnJetStreamCarriesTheWatermark(t *testing.T) {
	e := jsEnv(t, nil)
	cl := e.dial()
	cl.subscribe("a", "orders.*")
	e.publishN("orders.x", 1, 5)
	for i := 1; i <= 5; i++ {
		cl.expect(map[string]any{"type": "event", "data": i})
	}
	cl2 := e.dial()
	cl2.send(`{"type":"subscribe","id":"b","subject":"orders.*"}`)
	cl2.expect(map[string]any{"type": "subscribed", "id": "b", "cursor": "js:5"})
}

func TestUnsubscribeDuringResume(t *testing.T) {
	e := jsEnv(t, func(c *broker.JetStreamConfig) {})
	e.publishN("orders.x", 1, 3000)
	cl := e.dial()
	cl.send(`{"type":"subscribe","id":"s","subject":"orders.*","from":"first"}`)
	cl.send(`{"type":"unsubscribe","id":"s"}`)
	for {
		m := cl.next()
		if m["type"] == "unsubscribed" {
			break
		}
		if m["type"] != "subscribed" && m["type"] != "event" {
			t.Fatalf("unexpected %v", m)
		}
	}
	cl.quiet() // no event lists s after "unsubscribed"
	cl.subscribe("s", "orders.*")
}

// TestTwoGatewaysAndResumeOnTheOther runs two gateway nodes on one stream:
// each serves every event to its own clients, and a client that leaves one
// node resumes on the other with the cursor it had, missing nothing.
func TestTwoGatewaysAndResumeOnTheOther(t *testing.T) {
	a := jsEnv(t, nil)
	b := a.sibling(func(c *gateway.Config) { c.Subjects = []string{"orders.>", "app.>"} })
	ca, cb := a.dial(), b.dial()
	ca.subscribe("s", "orders.*")
	cb.subscribe("s", "orders.*")
	a.publishN("orders.x", 1, 20)
	var last string
	for i := 1; i <= 20; i++ {
		ca.expect(map[string]any{"type": "event", "data": i})
		m := cb.expect(map[string]any{"type": "event", "data": i})
		if i == 12 {
			last = m["cursor"].(string)
		}
	}
	// The client on node a goes away after event 12; events go on.
	_ = ca.c.CloseNow()
	a.publishN("orders.x", 21, 10)
	moved := b.dial()
	moved.send(`{"type":"subscribe","id":"s","subject":"orders.*","from":"` + last + `"}`)
	moved.expect(map[string]any{"type": "subscribed", "cursor": last})
	for i := 13; i <= 30; i++ {
		moved.expect(map[string]any{"type": "event", "data": i})
	}
	moved.quiet()
}

// TestSlowConsumerResumesWithoutLoss: a client that stops reading is closed
// with 4008; reconnecting with the last cursor it saw, it gets everything
// after it.
func TestSlowConsumerResumesWithoutLoss(t *testing.T) {
	e := newEnvJS(t, "jetstream", nil, func(c *gateway.Config) {
		c.Subjects = []string{"orders.>", "app.>"}
		c.MailboxMessages = 256
		c.CloseTimeout = time.Minute // the close frame waits for the reader
	})
	slow := e.dial()
	slow.subscribe("s", "orders.*")
	pad := strings.Repeat("x", 4<<10)
	const n = 6000 // 24 MiB: beyond socket buffers and the mailbox
	var out []broker.Outgoing
	for i := 1; i <= n; i++ {
		out = append(out, broker.Outgoing{Subject: "orders.x", Data: []byte(`{"i":` + strconv.Itoa(i) + `,"pad":"` + pad + `"}`)})
	}
	if _, err := e.b.Publish(context.Background(), out); err != nil {
		t.Fatal(err)
	}
	// The client reads only once the gateway has found it slow (JetStream
	// backpressure would otherwise let a client that starts reading in time
	// catch up).
	waitFor(t, "the slow consumer found", func() bool { return e.metric("fanwire_slow_consumers_total", nil) == 1 })
	// Read what was delivered before the 4008, remembering the last cursor.
	last := ""
	seen := 0
	for {
		if err := slow.readFrame(10 * time.Second); err != nil {
			if code := websocket.CloseStatus(err); code != gateway.CloseSlowConsumer {
				t.Fatalf("close %v (%v), want 4008", code, err)
			}
			break
		}
		for _, m := range slow.msgs {
			if m["type"] == "event" {
				seen++
				if got := m["data"].(map[string]any)["i"]; got != float64(seen) {
					t.Fatalf("before the close: event %v, want %d", got, seen)
				}
				last = m["cursor"].(string)
			}
		}
		slow.msgs, slow.raw = nil, nil
	}
	if seen >= n {
		t.Fatalf("the client saw all %d events: it was never slow", n)
	}
	again := e.dial()
	again.send(`{"type":"subscribe","id":"s","subject":"orders.*","from":"` + last + `"}`)
	again.expect(map[string]any{"type": "subscribed", "cursor": last})
	for i := seen + 1; i <= n; i++ {
		m := again.next()
		if m["type"] != "event" || m["data"].(map[string]any)["i"] != float64(i) {
			t.Fatalf("after resuming: %v, want event %d", m["type"], i)
		}
	}
	again.quiet()
}

// TestRedisStreamsLiveAndResume runs the gateway on Redis Streams, on one
// server and on a Redis Cluster: events carry rs: cursors, and a client
// resumes from one without gap or duplicate while events keep being
// published.
func TestRedisStreamsLiveAndResume(t *testing.T) {
	for _, kind := range []string{"redis", "redis-cluster"} {
		t.Run(kind, func(t *testing.T) {
			e := newEnvJS(t, kind, nil, nil)
			cl := e.dial()
			cl.subscribe("s", "orders.*")
			e.publishN("orders.x", 1, 50)
			var cursors []string
			for i := 1; i <= 50; i++ {
				m := cl.expect(map[string]any{"type": "event", "data": i})
				c, _ := m["cursor"].(string)
				if !strings.HasPrefix(c, "rs:") {
					t.Fatalf("event %d cursor %q, want rs:…", i, c)
				}
				cursors = append(cursors, c)
			}
			var wg sync.WaitGroup
			wg.Go(func() { e.publishN("orders.x", 51, 450) })
			again := e.dial()
			again.send(`{"type":"subscribe","id":"r","subject":"orders.*","from":"` + cursors[19] + `"}`)
			again.expect(map[string]any{"type": "subscribed", "cursor": cursors[19]})
			for i := 21; i <= 500; i++ {
				again.expect(map[string]any{"type": "event", "data": i})
			}
			wg.Wait()
			again.quiet()
		})
	}
}

// TestResumeHandsOverWhileEventsKeepComing resumes while events are
// published steadily: the hand-over must complete while they still flow
// (the gap since the last replay comes from the hub's recent events, not
// from yet another replay that a busy stream would always outrun).
func TestResumeHandsOverWhileEventsKeepComing(t *testing.T) {
	e := jsEnv(t, nil)
	e.publishN("orders.x", 1, 200)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var published int
	wg.Go(func() {
		for i := 201; ; i += 10 {
			select {
			case <-stop:
				published = i - 1
				return
			case <-time.After(2 * time.Millisecond): // about 5,000 events/s
			}
			e.publishN("orders.x", i, 10)
		}
	})
	cl := e.dial()
	cl.send(`{"type":"subscribe","id":"s","subject":"orders.*","from":"js:100"}`)
	cl.expect(map[string]any{"type": "subscribed", "cursor": "js:100"})
	next := 101
	live := func() bool { return e.metric("fanwire_subscriptions", nil) == 1 }
	deadline := time.Now().Add(10 * time.Second)
	for !live() { // keep reading (the replay waits for room) until the hand-over
		if time.Now().After(deadline) {
			close(stop)
			wg.Wait()
			t.Fatal("no hand-over while events kept coming")
		}
		m := cl.next()
		if m["data"] != float64(next) {
			t.Fatalf("event %v, want %d", m["data"], next)
		}
		next++
	}
	close(stop)
	wg.Wait()
	for ; next <= published; next++ {
		cl.expect(map[string]any{"type": "event", "data": next})
	}
	cl.quiet()
}

// TestGatewayRestartBetweenDisconnectAndResume: the only gateway shuts down
// (its clients get 1001), events are published while no gateway runs, and
// a client resumes on the restarted gateway with its last cursor.
func TestGatewayRestartBetweenDisconnectAndResume(t *testing.T) {
	a := jsEnv(t, nil)
	cl := a.dial()
	cl.subscribe("s", "orders.*")
	a.publishN("orders.x", 1, 10)
	var last string
	for i := 1; i <= 10; i++ {
		last = cl.expect(map[string]any{"type": "event", "data": i})["cursor"].(string)
	}
	stopped := make(chan struct{})
	go func() { // the close handshake needs the client reading
		a.stop()
		close(stopped)
	}()
	if code := cl.closeStatus(5 * time.Second); code != websocket.StatusGoingAway {
		t.Fatalf("on shutdown the client got close %d, want 1001", code)
	}
	<-stopped
	// No gateway runs: publish straight to the stream.
	js := brokertest.JetStream(t, a.ns.ClientURL())
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for i := 11; i <= 25; i++ {
		if _, err := js.Publish(ctx, "orders.x", []byte(strconv.Itoa(i))); err != nil {
			t.Fatal(err)
		}
	}
	b := a.sibling(func(c *gateway.Config) { c.Subjects = []string{"orders.>", "app.>"} })
	again := b.dial()
	again.send(`{"type":"subscribe","id":"s","subject":"orders.*","from":"` + last + `"}`)
	again.expect(map[string]any{"type": "subscribed", "cursor": last})
	for i := 11; i <= 25; i++ {
		again.expect(map[string]any{"type": "event", "data": i})
	}
	b.publishN("orders.x", 26, 5)
	for i := 26; i <= 30; i++ {
		again.expect(map[string]any{"type": "event", "data": i})
	}
	again.quiet()
}

// TestResumeOnDebianNATS29: on the nats-server Debian ships (2.9.10,
// which takes one filter subject per consumer, and only as
// filter_subject), a subscription with a cursor replays and goes live, with
// a subject space of one pattern (its replay waited forever before, the
// gateway retrying "multiple consumer filter subjects not supported") and
// of two with a pattern that spans both (the gateway did not start); and
// so does a subscription's own consumer (--consumer per-connection).
func TestResumeOnDebianNATS29(t *testing.T) {
	for _, c := range []struct {
		name     string
		subjects []string
		perConn  bool
	}{
		{"one pattern", []string{"orders.>"}, false},
		{"two patterns", []string{"orders.>", "app.>"}, false},
		{"two patterns, consumer per connection", []string{"orders.>", "app.>"}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			url := brokertest.NATSBinary(t, brokertest.DebianNATS)
			e := newEnvJS(t, "jetstream", func(jc *broker.JetStreamConfig) {
				jc.URL, jc.Subjects, jc.Storage = url, c.subjects, "file" // 2.9: memory needs 2.10
			}, func(gc *gateway.Config) {
				gc.Subjects = c.subjects
				if c.perConn {
					gc.Consumer = gateway.ConsumerPerConnection
				}
			})
			pattern, other := "*.x", "app.x"
			if len(c.subjects) == 1 {
				pattern, other = "orders.*", "orders.z"
			}
			e.publishN("orders.x", 1, 3)
			e.publishN(other, 4, 3)
			e.publishN("orders.y.z", 7, 1)
			cl := e.dial()
			cl.send(`{"type":"subscribe","id":"s","subject":"` + pattern + `","from":"js:2"}`)
			cl.expect(map[string]any{"type": "subscribed", "id": "s"})
			for i := 3; i <= 6; i++ {
				cl.expect(map[string]any{"type": "event", "data": i, "cursor": "js:" + strconv.Itoa(i)})
			}
			e.publishN("orders.y.z", 8, 1)
			e.publishN("orders.x", 9, 1)
			cl.expect(map[string]any{"type": "event", "data": 9, "cursor": "js:9"})
			cl.quiet()
		})
	}
}

// unsupportedReplay is a durable broker whose server cannot replay (as
// nats-server 2.9 could not replay on several filters): its Replay fails
// with ErrUnsupported every time.
type unsupportedReplay struct{ broker.Durable }

func (unsupportedReplay) Replay(context.Context, []string, string, string, func([]broker.Message) error) error {
	return fmt.Errorf("jetstream: replay consumer: %w: multiple consumer filter subjects not supported by nats-server", broker.ErrUnsupported)
}

// TestResumeTheBrokerCannotServeIsAnError: a replay the broker's server
// cannot do is answered with broker_unavailable and its reason, at once,
// not retried while the client waits for an answer forever; the
// connection stays, and a live subscription works.
func TestResumeTheBrokerCannotServeIsAnError(t *testing.T) {
	e := newEnvJS(t, "jetstream", nil, func(c *gateway.Config) {
		c.Subjects = []string{"orders.>", "app.>"}
		c.Broker = unsupportedReplay{c.Broker.(broker.Durable)}
	})
	// A live subscriber sees the three events dispatched first: the live
	// subscription below must not get them too.
	probe := e.dial()
	probe.subscribe("p", "orders.*")
	e.publishN("orders.x", 1, 3)
	for i := 1; i <= 3; i++ {
		probe.expect(map[string]any{"type": "event", "data": i})
	}
	cl := e.dial()
	cl.send(`{"type":"subscribe","id":"s","subject":"orders.*","from":"js:1"}`)
	m := cl.expect(map[string]any{"type": "error", "code": "broker_unavailable", "id": "s"})
	if msg, _ := m["message"].(string); !strings.Contains(msg, "not supported") {
		t.Errorf("message %q, want the reason", msg)
	}
	cl.subscribe("s", "orders.*")
	e.publishN("orders.x", 4, 1)
	cl.expect(map[string]any{"type": "event", "data": 4})
}

// TestResumeSkipsEventOverMailboxBytes: an event in the stream that could
// never fit in a mailbox is skipped, live and on a resume (which before
// closed the client with 4008 every time it came back).
func TestResumeSkipsEventOverMailboxBytes(t *testing.T) {
	e := newEnvJS(t, "jetstream", nil, func(c *gateway.Config) {
		c.Subjects = []string{"orders.>", "app.>"}
		c.MailboxBytes, c.MaxPublishBytes = 4096, 4096
	})
	live := e.dial()
	live.subscribe("l", "orders.*")
	for _, data := range []string{`1`, `"` + strings.Repeat("x", 5000) + `"`, `3`} {
		if _, err := e.b.Publish(context.Background(), []broker.Outgoing{{Subject: "orders.x", Data: []byte(data)}}); err != nil {
			t.Fatal(err)
		}
	}
	live.expect(map[string]any{"type": "event", "cursor": "js:1"})
	live.expect(map[string]any{"type": "event", "cursor": "js:3"})
	live.quiet()
	cl := e.dial()
	cl.send(`{"type":"subscribe","id":"r","subject":"orders.*","from":"first"}`)
	cl.expect(map[string]any{"type": "subscribed", "id": "r"})
	cl.expect(map[string]any{"type": "event", "cursor": "js:1"})
	cl.expect(map[string]any{"type": "event", "cursor": "js:3"})
	cl.quiet()
}
