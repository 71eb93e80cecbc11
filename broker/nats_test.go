package broker_test

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fanwire/fanwire/broker"
	"github.com/fanwire/fanwire/broker/brokertest"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

func TestMain(m *testing.M) { brokertest.VerifyTestMain(m) }

// consumer runs Consume in the background and collects what it delivers.
type consumer struct {
	mu   sync.Mutex
	msgs []broker.Message
	stop func() error
}

func consume(t *testing.T, b broker.Broker) *consumer {
	t.Helper()
	c := &consumer{}
	ctx, cancel := context.WithCancel(context.Background())
	started := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- b.Consume(ctx, func(batch []broker.Message, arrived time.Time) {
			if arrived.IsZero() {
				t.Error("batch without an arrival time")
			}
			c.mu.Lock()
			c.msgs = append(c.msgs, batch...)
			c.mu.Unlock()
		}, func(string) { close(started) })
	}()
	select {
	case <-started:
	case err := <-done:
		t.Fatalf("consume ended before it started: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("consume did not start")
	}
	var once sync.Once
	c.stop = func() (err error) {
		once.Do(func() { cancel(); err = <-done })
		return err
	}
	t.Cleanup(func() { _ = c.stop() })
	return c
}

func (c *consumer) waitFor(t *testing.T, n int) []broker.Message {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		c.mu.Lock()
		got := append([]broker.Message(nil), c.msgs...)
		c.mu.Unlock()
		if len(got) >= n {
			return got
		}
		if time.Now().After(deadline) {
			t.Fatalf("got %d messages, want %d", len(got), n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func dial(t *testing.T, url string, subjects ...string) *broker.NATS {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	b, err := broker.DialNATS(ctx, broker.NATSConfig{URL: url, Subjects: subjects})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b
}

func TestNATSPublishConsumeInOrder(t *testing.T) {
	t.Parallel()
	ns := brokertest.NATS(t)
	b := dial(t, ns.ClientURL(), "app.>")
	c := consume(t, b)
	var out []broker.Outgoing
	for i := range 500 {
		out = append(out, broker.Outgoing{Subject: fmt.Sprintf("app.%d", i%3), Data: []byte(fmt.Sprint(i))})
	}
	out = append(out, broker.Outgoing{Subject: "other.x", Data: []byte(`"outside the subject space"`)},
		broker.Outgoing{Subject: "app.end", Data: []byte(`"sentinel"`)})
	cursors, err := b.Publish(context.Background(), out)
	if err != nil {
		t.Fatal(err)
	}
	if len(cursors) != len(out) || cursors[0] != "" {
		t.Fatalf("cursors %d (%q), want %d empty ones: Core NATS keeps no history", len(cursors), cursors[0], len(out))
	}
	got := c.waitFor(t, 501)
	for i, m := range got[:500] {
		if string(m.Data) != fmt.Sprint(i) || m.Subject != fmt.Sprintf("app.%d", i%3) || m.Cursor != "" {
			t.Fatalf("message %d: %s %q %q", i, m.Subject, m.Data, m.Cursor)
		}
	}
	// Had the message outside the subject space been delivered, it would
	// come before the sentinel.
	if len(got) != 501 || got[500].Subject != "app.end" {
		t.Fatalf("after 500 messages: %d in all, then %s", len(got), got[500].Subject)
	}
	if err := c.stop(); err != context.Canceled {
		t.Fatalf("consume returned %v, want context.Canceled", err)
	}
}

// TestNATSSurvivesServerRestart stops the NATS server under a consuming
// broker and starts it again on the same port: Ready follows the
// connection, and messages published after the restart are delivered.
func TestNATSSurvivesServerRestart(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ns, err := broker.StartEmbedded(broker.EmbeddedConfig{StoreDir: dir, JetStream: true})
	if err != nil {
		t.Fatal(err)
	}
	port := ns.Addr().(*net.TCPAddr).Port
	b := dial(t, ns.ClientURL())
	c := consume(t, b)
	if !b.Ready() {
		t.Fatal("not ready while connected")
	}
	ns.Shutdown()
	ns.WaitForShutdown()
	deadline := time.Now().Add(10 * time.Second)
	for b.Ready() {
		if time.Now().After(deadline) {
			t.Fatal("still ready with the server down")
		}
		time.Sleep(5 * time.Millisecond)
	}
	ns, err = broker.StartEmbedded(broker.EmbeddedConfig{Port: port, StoreDir: dir, JetStream: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	for !b.Ready() {
		if time.Now().After(deadline.Add(10 * time.Second)) {
			t.Fatal("not ready again after the server came back")
		}
		time.Sleep(5 * time.Millisecond)
	}
	// The subscription is restored on reconnect; publish until it arrives
	// (the resubscription races with the first publish).
	for i := 0; ; i++ {
		if _, err := b.Publish(context.Background(), []broker.Outgoing{{Subject: "back", Data: []byte(`1`)}}); err != nil {
			t.Fatal(err)
		}
		c.mu.Lock()
		n := len(c.msgs)
		c.mu.Unlock()
		if n > 0 {
			break
		}
		if i > 200 {
			t.Fatal("nothing delivered after the server restart")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestNATSDialFailsClearly(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, err := broker.DialNATS(ctx, broker.NATSConfig{URL: "nats://127.0.0.1:1"})
	if err == nil {
		t.Fatal("dial to a closed port succeeded")
	}
	t.Log(err)
}

// TestNATSCloseIsNotADisconnect: closing the broker logs no "disconnected"
// warning (every ingest and ws process printed one on a normal stop),
// while a connection the server drops still does.
func TestNATSCloseIsNotADisconnect(t *testing.T) {
	t.Parallel()
	ns := brokertest.NATS(t)
	core, logs := observer.New(zap.InfoLevel)
	ctx := context.Background()
	b, err := broker.DialNATS(ctx, broker.NATSConfig{URL: ns.ClientURL(), Logger: zap.New(core)})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if n := logs.FilterMessage("nats disconnected").Len(); n != 0 {
		t.Fatalf("Close logged %d disconnect warnings", n)
	}

	b, err = broker.DialNATS(ctx, broker.NATSConfig{URL: ns.ClientURL(), Name: "kicked", Logger: zap.New(core)})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	kickClient(t, ns, "kicked")
	deadline := time.Now().Add(5 * time.Second)
	for logs.FilterMessage("nats disconnected").Len() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("a connection dropped by the server logged no disconnect warning")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestNATSDropsAreCountedInFull: the library raises a slow consumer once
// per episode, not once per message dropped, so counting only then
// reported the drops up to that moment and lagged the rest until the next
// episode. Consume counts after every batch: once a flood is over, what
// OnDrop reported is every message published and not delivered, through
// a second flood too.
func TestNATSDropsAreCountedInFull(t *testing.T) {
	t.Parallel()
	ns := brokertest.NATS(t)
	var mu sync.Mutex
	reported := 0
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	b, err := broker.DialNATS(ctx, broker.NATSConfig{URL: ns.ClientURL(), Subjects: []string{"app.>"}, OnDrop: func(n int) {
		mu.Lock()
		reported += n
		mu.Unlock()
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	broker.SetNATSBuffer(b, 8)
	var delivered int
	cctx, stop := context.WithCancel(context.Background())
	started := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- b.Consume(cctx, func(batch []broker.Message, _ time.Time) {
			mu.Lock()
			delivered += len(batch)
			mu.Unlock()
			time.Sleep(time.Millisecond) // a busy handler
		}, func(string) { close(started) })
	}()
	t.Cleanup(func() { stop(); <-done })
	<-started
	const flood = 5000
	published := 0
	for round := 1; round <= 2; round++ {
		msgs := make([]broker.Outgoing, flood)
		for i := range msgs {
			msgs[i] = broker.Outgoing{Subject: "app.x", Data: fmt.Appendf(nil, "%d-%d", round, i)}
		}
		if _, err := b.Publish(ctx, msgs); err != nil {
			t.Fatal(err)
		}
		published += flood
		// Every message is delivered or dropped soon; then the count must
		// be complete.
		deadline := time.Now().Add(10 * time.Second)
		for {
			mu.Lock()
			d, r := delivered, reported
			mu.Unlock()
			if d+r == published {
				if r == 0 {
					t.Fatalf("round %d: nothing dropped from a flood of %d into a buffer of 8: the test needs a slower handler", round, flood)
				}
				t.Logf("round %d: %d delivered, %d dropped", round, d, r)
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("round %d: %d published, %d delivered, %d reported dropped: %d drops not reported", round, published, d, r, published-d-r)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// TestStartEmbeddedSaysWhyNot: an embedded server whose client or route
// port is taken fails at once with the server's own reason, not after the
// readiness wait with a guess.
func TestStartEmbeddedSaysWhyNot(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	taken := l.Addr().(*net.TCPAddr).Port
	for name, cfg := range map[string]broker.EmbeddedConfig{
		"client port": {Port: taken},
		"route port":  {Cluster: &broker.EmbeddedCluster{Name: "c", Port: taken, Routes: []string{"nats-route://127.0.0.1:" + fmt.Sprint(taken)}}},
	} {
		start := time.Now()
		ns, err := broker.StartEmbedded(cfg)
		if err == nil {
			ns.Shutdown()
			t.Fatalf("%s taken: started", name)
		}
		if !strings.Contains(err.Error(), "address already in use") {
			t.Fatalf("%s taken: %v; want the listener's error", name, err)
		}
		t.Logf("%s taken: %v (after %v)", name, err, time.Since(start).Round(time.Millisecond))
	}
}
