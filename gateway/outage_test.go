package gateway_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/fanwire/fanwire/broker"
	"github.com/fanwire/fanwire/broker/brokertest"
	"github.com/fanwire/fanwire/gateway"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// outageSteps take a gateway's durable broker through an outage.
type outageSteps struct {
	stop    func()             // takes the broker down
	publish func(first, n int) // publishes events first..first+n-1 on orders.x where the gateway cannot see them yet
	restart func()             // brings the broker back where the gateway connects, with what publish stored
}

// outage runs an outage under a gateway with a subscribed client: the
// gateway reports not ready while its broker is down; events published
// meanwhile reach the client once the gateway has reconnected by itself,
// exactly once and in order, and the live feed goes on.
func outage(t *testing.T, e *env, steps outageSteps) {
	t.Helper()
	cl := e.dial()
	cl.subscribe("s", "orders.*")
	e.publishN("orders.x", 1, 5)
	for i := 1; i <= 5; i++ {
		cl.expect(map[string]any{"type": "event", "data": i})
	}
	steps.stop()
	waitFor(t, "not ready while the broker is down", func() bool { return !e.ready() })
	steps.publish(6, 10)
	if e.ready() {
		t.Fatal("ready while the broker is still down")
	}
	cl.quiet() // the gateway could not have seen them
	steps.restart()
	waitFor(t, "ready after the broker came back", e.ready)
	for i := 6; i <= 15; i++ {
		// The broker client reconnects on its own schedule, and the
		// JetStream consumer is re-created after that: up to seconds.
		if m := cl.nextWithin(30 * time.Second); m["type"] != "event" || m["data"] != float64(i) {
			t.Fatalf("after the outage: %v, want event %d", m, i)
		}
	}
	e.publishN("orders.x", 16, 5)
	for i := 16; i <= 20; i++ {
		cl.expect(map[string]any{"type": "event", "data": i})
	}
	cl.quiet()
}

// publishThrough publishes events first..first+n-1 (data: their number) on
// orders.x through b, then closes b.
func publishThrough(t *testing.T, b broker.Broker, first, n int) {
	t.Helper()
	defer b.Close()
	var out []broker.Outgoing
	for i := first; i < first+n; i++ {
		out = append(out, broker.Outgoing{Subject: "orders.x", Data: []byte(strconv.Itoa(i))})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := b.Publish(ctx, out); err != nil {
		t.Fatal(err)
	}
}

// TestJetStreamOutage stops the NATS server under a gateway on a file
// stream. The events of the outage are published through a server on
// another port with the same store: the gateway does not know that port,
// so they are published while it is disconnected, whatever its reconnect
// timing. Then the server starts again on its port.
//
// In per-connection mode the subscription's own consumer (in memory) is
// lost with the server: the feed opens a new one after its last event.
func TestJetStreamOutage(t *testing.T) {
	if testing.Short() {
		t.Skip("-short (make test-quick) leaves out the slow tests: make test runs them")
	}
	for _, mode := range []string{gateway.ConsumerShared, gateway.ConsumerPerConnection} {
		t.Run(mode, func(t *testing.T) { jetStreamOutage(t, mode) })
	}
}

func jetStreamOutage(t *testing.T, mode string) {
	e := newEnvJS(t, "jetstream", func(c *broker.JetStreamConfig) { c.Storage = "file" }, func(c *gateway.Config) {
		c.Subjects = []string{"orders.>", "app.>"}
		c.Consumer = mode
	})
	port, dir := brokertest.Port(e.ns), brokertest.StoreDir(e.ns)
	outage(t, e, outageSteps{
		stop: func() {
			e.ns.Shutdown()
			e.ns.WaitForShutdown()
		},
		publish: func(first, n int) {
			side := brokertest.NATSWithStore(t, dir, 0)
			defer func() {
				side.Shutdown()
				side.WaitForShutdown()
			}()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			b, err := broker.DialJetStream(ctx, broker.JetStreamConfig{
				NATSConfig: broker.NATSConfig{URL: side.ClientURL(), Subjects: []string{"orders.>", "app.>"}},
				Storage:    "file",
			})
			if err != nil {
				t.Fatal(err)
			}
			publishThrough(t, b, first, n)
		},
		restart: func() { e.ns = brokertest.NATSWithStore(t, dir, port) },
	})
}

// TestRedisOutage kills redis-server under a gateway (it keeps an
// append-only file, fsynced before each reply). The events of the outage
// are published through a redis-server on another port with the same data
// directory, which the gateway does not know; then the server starts again
// on its port. (Cutting the gateway's connection with CLIENT KILL would not
// test the claim: the client library reconnects at once, often within its
// own retries, so nothing can be published "while it is disconnected" and
// /readyz may never see the outage.)
func TestRedisOutage(t *testing.T) {
	if testing.Short() {
		t.Skip("-short (make test-quick) leaves out the slow tests: make test runs them")
	}
	e := newEnvJS(t, "redis", nil, nil)
	outage(t, e, outageSteps{
		stop: e.redis.Kill,
		publish: func(first, n int) {
			side := brokertest.StartRedis(t, e.redis.Dir, 0)
			defer side.Kill()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			b, err := broker.DialRedis(ctx, broker.RedisConfig{URL: "redis://" + side.Addr(), Stream: "{fanwire}"})
			if err != nil {
				t.Fatal(err)
			}
			publishThrough(t, b, first, n)
		},
		restart: e.redis.Start,
	})
}

// TestJetStreamMemoryStreamLost restarts the NATS server under a gateway
// on a memory stream, which the restart loses. The gateway re-creates the
// stream with its settings, numbered on after the last event it delivered
// (so cursors keep increasing), warns that the history is lost, and its
// clients go on receiving. A cursor from the lost history has expired.
func TestJetStreamMemoryStreamLost(t *testing.T) {
	if testing.Short() {
		t.Skip("-short (make test-quick) leaves out the slow tests: make test runs them")
	}
	core, logs := observer.New(zap.WarnLevel)
	e := jsEnv(t, func(c *broker.JetStreamConfig) {
		c.Storage = "memory"
		c.Logger = zap.New(core)
	})
	cl := e.dial()
	cl.subscribe("s", "orders.*")
	e.publishN("orders.x", 1, 5)
	for i := 1; i <= 5; i++ {
		cl.expect(map[string]any{"type": "event", "data": i, "cursor": "js:" + strconv.Itoa(i)})
	}
	e.ns = brokertest.RestartNATS(t, e.ns)
	waitFor(t, "ready after the restart", e.ready)
	// Until the stream is back, a publish is answered "no responders" and
	// Publish tries again.
	var out []broker.Outgoing
	for i := 6; i <= 10; i++ {
		out = append(out, broker.Outgoing{Subject: "orders.x", Data: []byte(strconv.Itoa(i))})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := e.b.Publish(ctx, out); err != nil {
		t.Fatal(err)
	}
	for i := 6; i <= 10; i++ {
		m := cl.nextWithin(30 * time.Second)
		if m["type"] != "event" || m["data"] != float64(i) || m["cursor"] != "js:"+strconv.Itoa(i) {
			t.Fatalf("after the stream was lost: %v, want event %d with cursor js:%d", m, i, i)
		}
	}
	cl.quiet()
	if n := logs.FilterMessageSnippet("history").Len(); n != 1 {
		t.Errorf("%d warnings that the history was lost, want 1; logged: %v", n, logs.All())
	}
	again := e.dial()
	again.send(`{"type":"subscribe","id":"r","subject":"orders.*","from":"js:2"}`)
	again.expect(map[string]any{"type": "error", "code": "cursor_expired", "id": "r"})
	again.send(`{"type":"subscribe","id":"r","subject":"orders.*","from":"js:5"}`)
	again.expect(map[string]any{"type": "subscribed", "cursor": "js:5"})
	for i := 6; i <= 10; i++ {
		again.expect(map[string]any{"type": "event", "data": i})
	}
	again.quiet()
}
