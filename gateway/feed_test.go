package gateway_test

import (
	"context"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fanwire/fanwire/broker"
	"github.com/fanwire/fanwire/broker/brokertest"
	"github.com/fanwire/fanwire/gateway"
	"github.com/nats-io/nats.go/jetstream"
)

// consumers lists the subscription consumers on the gateway's stream (not
// the node's shared ordered consumer, which acks nothing).
func (e *env) consumers() []string {
	e.t.Helper()
	js := brokertest.JetStream(e.t, e.ns.ClientURL())
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, "FANWIRE")
	if err != nil {
		e.t.Fatal(err)
	}
	var names []string
	l := s.ListConsumers(ctx)
	for ci := range l.Info() {
		if ci.Config.AckPolicy == jetstream.AckAllPolicy {
			names = append(names, ci.Name)
		}
	}
	if err := l.Err(); err != nil {
		e.t.Fatal(err)
	}
	sort.Strings(names)
	return names
}

// durableEnv is a JetStream gateway without authentication whose
// connections keep durables (AnonymousDurables).
func durableEnv(t *testing.T) *env {
	return newEnvJS(t, "jetstream", nil, func(c *gateway.Config) {
		c.Subjects = []string{"orders.>", "app.>"}
		c.AnonymousDurables = true
	})
}

// perConnEnv is a JetStream gateway in per-connection consumer mode.
func perConnEnv(t *testing.T) *env {
	return newEnvJS(t, "jetstream", nil, func(c *gateway.Config) {
		c.Subjects = []string{"orders.>", "app.>"}
		c.Consumer = gateway.ConsumerPerConnection
	})
}

// TestPerConnectionConsumers serves every subscription from its own
// consumer: each client gets every event in order while events are
// published, a "from" subscription replays then continues, and the
// consumers are deleted on unsubscribe and when the connection ends.
func TestPerConnectionConsumers(t *testing.T) {
	e := perConnEnv(t)
	e.publishN("orders.x", 1, 100)
	const n = 5
	var cls []*client
	for range n {
		cl := e.dial()
		cl.send(`{"type":"subscribe","id":"s","subject":"orders.*"}`)
		cl.expect(map[string]any{"type": "subscribed", "id": "s", "cursor": "js:100"})
		cls = append(cls, cl)
	}
	from := e.dial()
	from.send(`{"type":"subscribe","id":"f","subject":"orders.x","from":"js:50"}`)
	from.expect(map[string]any{"type": "subscribed", "id": "f", "cursor": "js:50"})
	if got := len(e.consumers()); got != n+1 {
		t.Fatalf("%d consumers on the stream, want %d (one per subscription)", got, n+1)
	}
	var wg sync.WaitGroup
	wg.Go(func() { e.publishN("orders.x", 101, 1900) })
	for _, cl := range cls {
		for i := 101; i <= 2000; i++ {
			cl.expect(map[string]any{"type": "event", "data": i, "cursor": "js:" + strconv.Itoa(i)})
		}
	}
	for i := 51; i <= 2000; i++ {
		from.expect(map[string]any{"type": "event", "data": i})
	}
	wg.Wait()
	from.send(`{"type":"unsubscribe","id":"f"}`)
	from.expect(map[string]any{"type": "unsubscribed", "id": "f"})
	if got := len(e.consumers()); got != n {
		t.Fatalf("after an unsubscribe: %d consumers, want %d", got, n)
	}
	for _, cl := range cls {
		cl.quiet()
		_ = cl.c.CloseNow()
	}
	waitFor(t, "the closed connections' consumers to be deleted", func() bool { return len(e.consumers()) == 0 })
	if got := e.metric("fanwire_subscriptions", nil); got != 0 {
		t.Fatalf("fanwire_subscriptions = %v after every connection closed", got)
	}
}

// TestDurableSubscriptionResumesWithoutACursor binds a named durable
// consumer (in the default shared mode): a client that comes back with
// the same name, and no cursor, gets exactly what it missed; unsubscribing
// deletes the durable.
func TestDurableSubscriptionResumesWithoutACursor(t *testing.T) {
	e := durableEnv(t)
	cl := e.dial()
	cl.send(`{"type":"subscribe","id":"d","subject":"orders.*","durable":"dash-1"}`)
	cl.expect(map[string]any{"type": "subscribed", "id": "d"})
	e.publishN("orders.x", 1, 300)
	for i := 1; i <= 300; i++ {
		cl.expect(map[string]any{"type": "event", "data": i})
	}
	cl.quiet()
	// While it is bound here, nobody else on this node may bind it.
	other := e.dial()
	other.send(`{"type":"subscribe","id":"o","subject":"orders.*","durable":"dash-1"}`)
	other.expect(map[string]any{"type": "error", "id": "o", "code": "durable_in_use"})
	_ = cl.c.CloseNow()
	waitFor(t, "the connection to end", func() bool { return e.metric("fanwire_connections", nil) == 1 })
	if got := e.consumers(); len(got) != 1 || !strings.HasSuffix(got[0], "_dash-1") {
		t.Fatalf("consumers after the client left: %v, want the durable only", got)
	}
	e.publishN("orders.x", 301, 200)
	// Bound again, from another connection (it could be another node).
	other.send(`{"type":"subscribe","id":"o","subject":"orders.*","durable":"dash-1"}`)
	other.expect(map[string]any{"type": "subscribed", "id": "o", "cursor": "js:300"})
	for i := 301; i <= 500; i++ {
		other.expect(map[string]any{"type": "event", "data": i})
	}
	other.quiet()
	other.send(`{"type":"unsubscribe","id":"o"}`)
	other.expect(map[string]any{"type": "unsubscribed", "id": "o"})
	if got := e.consumers(); len(got) != 0 {
		t.Fatalf("consumers after unsubscribing the durable: %v, want none", got)
	}
}

// TestDurableQueuedEventsAreNotLost leaves a durable while events are
// queued for it but not written (the client stopped reading): binding it
// again starts with them.
func TestDurableQueuedEventsAreNotLost(t *testing.T) {
	e := newEnvJS(t, "jetstream", nil, func(c *gateway.Config) {
		c.Subjects = []string{"orders.>", "app.>"}
		c.MailboxMessages = 64
		c.AnonymousDurables = true
	})
	cl := e.dial()
	cl.send(`{"type":"subscribe","id":"d","subject":"orders.*","durable":"slow"}`)
	cl.expect(map[string]any{"type": "subscribed", "id": "d"})
	e.publishN("orders.x", 1, 20)
	for i := 1; i <= 20; i++ {
		cl.expect(map[string]any{"type": "event", "data": i})
	}
	// Big events, not read: the socket buffers and the mailbox fill, the
	// consumer stops pulling.
	pad := `"` + strings.Repeat("p", 16<<10) + `"`
	var out []broker.Outgoing
	for i := 21; i <= 200; i++ {
		out = append(out, broker.Outgoing{Subject: "orders.x", Data: []byte(`{"i":` + strconv.Itoa(i) + `,"pad":` + pad + `}`)})
	}
	if _, err := e.b.Publish(context.Background(), out); err != nil {
		t.Fatal(err)
	}
	// Read a few of them, then leave.
	last := 20
	for range 5 {
		m := cl.next()
		last = int(m["data"].(map[string]any)["i"].(float64))
	}
	_ = cl.c.CloseNow()
	waitFor(t, "the connection to end", func() bool { return e.metric("fanwire_connections", nil) == 0 })
	again := e.dial()
	again.send(`{"type":"subscribe","id":"d","subject":"orders.*","durable":"slow"}`)
	sub := again.expect(map[string]any{"type": "subscribed", "id": "d"})
	c, err := strconv.Atoi(sub["cursor"].(string)[3:])
	// Acknowledged in chunks of broker.AckEvery once written: the client
	// may see again at most one chunk it had read, never miss one.
	if err != nil || c < last-broker.AckEvery {
		t.Fatalf("bound again after %v; the client had read up to event %d", sub["cursor"], last)
	}
	// Everything after the durable's position arrives, once, in order:
	// nothing the client was not sent is skipped.
	for i := c + 1; i <= 200; i++ {
		m := again.next()
		if m["type"] != "event" || int(m["data"].(map[string]any)["i"].(float64)) != i {
			t.Fatalf("after binding again at js:%d: %v, want event %d", c, m["type"], i)
		}
	}
	again.quiet()
}

// TestDurableErrors: every misuse gets bad_durable and keeps the
// connection.
func TestDurableErrors(t *testing.T) {
	e := durableEnv(t)
	cl := e.dial()
	cl.send(`{"type":"subscribe","id":"a","subject":"orders.*","durable":"x.y"}`)
	cl.expect(map[string]any{"type": "error", "id": "a", "code": "bad_durable"})
	cl.send(`{"type":"subscribe","id":"a","subject":"orders.*","durable":""}`)
	cl.expect(map[string]any{"type": "error", "id": "a", "code": "bad_durable"})
	cl.send(`{"type":"subscribe","id":"a","subject":"orders.*","durable":"d"}`)
	cl.expect(map[string]any{"type": "subscribed", "id": "a"})
	cl.send(`{"type":"unsubscribe","id":"a","durable":"d"}`)
	cl.expect(map[string]any{"type": "error", "id": "a", "code": "bad_frame"})
	_ = cl.c.CloseNow()
	waitFor(t, "the connection to end", func() bool { return e.metric("fanwire_connections", nil) == 0 })
	again := e.dial()
	again.send(`{"type":"subscribe","id":"b","subject":"app.>","durable":"d"}`)
	again.expect(map[string]any{"type": "error", "id": "b", "code": "bad_durable"})
	again.send(`{"type":"subscribe","id":"b","subject":"orders.*","durable":"d","from":"js:99"}`)
	again.expect(map[string]any{"type": "error", "id": "b", "code": "bad_cursor"})
	again.quiet()

	core := newEnv(t, nil)
	c2 := core.dial()
	c2.send(`{"type":"subscribe","id":"a","subject":"x","durable":"d"}`)
	c2.expect(map[string]any{"type": "error", "id": "a", "code": "bad_durable"})
	if _, err := gateway.New(gateway.Config{Broker: core.b, Consumer: gateway.ConsumerPerConnection}); err == nil {
		t.Fatal("per-connection consumers on Core NATS: no error")
	}
}
