package broker_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/fanwire/fanwire/broker"
	"github.com/fanwire/fanwire/broker/brokertest"
)

// consumeUntil runs c until h has seen n messages, acking each batch when
// ack is set, and returns them.
func consumeUntil(t *testing.T, c broker.Consumer, n int, ack bool) []broker.Message {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var got []broker.Message
	err := c.Consume(ctx, 10*time.Millisecond, func(ms []broker.Message) {
		got = append(got, ms...)
		if ack && len(ms) > 0 {
			if err := c.Ack(ctx, ms[len(ms)-1].Cursor, true); err != nil {
				t.Error(err)
			}
		}
		if len(got) >= n {
			cancel()
		}
	})
	if !errors.Is(err, context.Canceled) || len(got) != n {
		t.Fatalf("consume: %d messages (%v), want %d", len(got), err, n)
	}
	return got
}

func TestJetStreamSubscriptionConsumers(t *testing.T) {
	t.Parallel()
	ns := brokertest.NATS(t)
	b := dialJS(t, broker.JetStreamConfig{NATSConfig: broker.NATSConfig{URL: ns.ClientURL(), Subjects: []string{"db.>"}}, Stream: "C"})
	ctx := context.Background()
	pub := func(from, to int) {
		var out []broker.Outgoing
		for i := from; i <= to; i++ {
			out = append(out, broker.Outgoing{Subject: fmt.Sprintf("db.%s.%d", []string{"a", "b"}[i%2], i), Data: []byte(fmt.Sprint(i))})
		}
		if _, err := b.Publish(ctx, out); err != nil {
			t.Fatal(err)
		}
	}
	pub(1, 10) // sequences 1..10

	// Live: starts after the stream's last event.
	live, err := b.OpenConsumer(ctx, broker.ConsumerConfig{Filters: []string{"db.a.*"}})
	if err != nil {
		t.Fatal(err)
	}
	if live.Start() != "js:10" || live.Bound() {
		t.Fatalf("live consumer starts after %q (bound %v), want js:10", live.Start(), live.Bound())
	}
	pub(11, 14)
	if got := consumeUntil(t, live, 2, true); got[0].Cursor != "js:12" || got[1].Cursor != "js:14" {
		t.Fatalf("live consumer got %v, want js:12, js:14", got)
	}
	if err := live.Delete(ctx); err != nil {
		t.Fatal(err)
	}

	// A durable from a cursor, left after acking, and bound again: it
	// continues after what was acknowledged, without a cursor.
	d, err := b.OpenConsumer(ctx, broker.ConsumerConfig{Filters: []string{"db.>"}, Name: "dash", From: "js:4"})
	if err != nil {
		t.Fatal(err)
	}
	if d.Start() != "js:4" || d.Bound() {
		t.Fatalf("new durable: start %q bound %v", d.Start(), d.Bound())
	}
	got := consumeUntil(t, d, 10, true)
	if got[0].Cursor != "js:5" || got[9].Cursor != "js:14" {
		t.Fatalf("durable got %s..%s, want js:5..js:14", got[0].Cursor, got[9].Cursor)
	}
	waitAcked := func(want string) broker.Consumer {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for {
			again, err := b.OpenConsumer(ctx, broker.ConsumerConfig{Filters: []string{"db.>"}, Name: "dash"})
			if err != nil {
				t.Fatal(err)
			}
			if !again.Bound() {
				t.Fatal("binding the durable again created a new one")
			}
			if again.Start() == want || time.Now().After(deadline) {
				if again.Start() != want {
					t.Fatalf("bound durable starts after %q, want %q", again.Start(), want)
				}
				return again
			}
			time.Sleep(10 * time.Millisecond) // the ack is on its way
		}
	}
	again := waitAcked("js:14")
	pub(15, 16)
	if got := consumeUntil(t, again, 2, false); got[0].Cursor != "js:15" {
		t.Fatalf("bound durable got %v, want js:15 first", got)
	}
	// Not acknowledged: delivered again to the next binding.
	again = waitAcked("js:14")
	if got := consumeUntil(t, again, 2, true); got[0].Cursor != "js:15" || got[1].Cursor != "js:16" {
		t.Fatalf("unacknowledged events: %v, want js:15, js:16 again", got)
	}

	// A cursor moves an existing durable: the client's cursor is exact.
	moved, err := b.OpenConsumer(ctx, broker.ConsumerConfig{Filters: []string{"db.>"}, Name: "dash", From: "js:12"})
	if err != nil || moved.Bound() || moved.Start() != "js:12" {
		t.Fatalf("durable moved to js:12: %v bound %v start %q", err, moved != nil && moved.Bound(), moved.Start())
	}
	if got := consumeUntil(t, moved, 4, true); got[0].Cursor != "js:13" || got[3].Cursor != "js:16" {
		t.Fatalf("moved durable got %v, want js:13..js:16", got)
	}
	again = waitAcked("js:16")

	// Another filter under the same name, a bad name, bad cursors.
	if _, err := b.OpenConsumer(ctx, broker.ConsumerConfig{Filters: []string{"db.a.*"}, Name: "dash"}); !errors.Is(err, broker.ErrBadConsumer) {
		t.Fatalf("durable with another filter: %v, want ErrBadConsumer", err)
	}
	if _, err := b.OpenConsumer(ctx, broker.ConsumerConfig{Filters: []string{"db.>"}, Name: "a.b"}); !errors.Is(err, broker.ErrBadConsumer) {
		t.Fatalf("bad durable name: %v, want ErrBadConsumer", err)
	}
	if _, err := b.OpenConsumer(ctx, broker.ConsumerConfig{Filters: []string{"db.>"}, From: "js:99"}); !errors.Is(err, broker.ErrBadCursor) {
		t.Fatalf("cursor ahead: %v, want ErrBadCursor", err)
	}
	if _, err := b.OpenConsumer(ctx, broker.ConsumerConfig{Filters: []string{"db.>"}, From: "rs:1-0"}); !errors.Is(err, broker.ErrBadCursor) {
		t.Fatalf("foreign cursor: %v, want ErrBadCursor", err)
	}
	if err := again.Delete(ctx); err != nil {
		t.Fatal(err)
	}
	fresh, err := b.OpenConsumer(ctx, broker.ConsumerConfig{Filters: []string{"db.a.*"}, Name: "dash", From: "first"})
	if err != nil || fresh.Bound() || fresh.Start() != "" {
		t.Fatalf("after delete the name is free: %v bound %v start %q", err, fresh != nil && fresh.Bound(), fresh.Start())
	}
	_ = fresh.Delete(ctx)
}

// TestJetStreamDurableOwners: a durable's server-side name is its owner's
// (DurableName): two owners naming the same durable get two consumers on
// their own filters. MaxDurables caps an owner's durables in the broker:
// a new one past it fails with ErrTooManyConsumers, binding or moving one
// of its own does not, another owner's do not count, and a deleted one
// frees its slot.
func TestJetStreamDurableOwners(t *testing.T) {
	t.Parallel()
	ns := brokertest.NATS(t)
	b := dialJS(t, broker.JetStreamConfig{NATSConfig: broker.NATSConfig{URL: ns.ClientURL(), Subjects: []string{"db.>"}}, Stream: "O"})
	ctx := context.Background()
	open := func(owner, name, filter, from string) (broker.Consumer, error) {
		return b.OpenConsumer(ctx, broker.ConsumerConfig{Filters: []string{filter}, Name: name, Owner: owner, MaxDurables: 2, From: from})
	}
	a, err := open("alice", "inbox", "db.a.>", "")
	if err != nil {
		t.Fatal(err)
	}
	bob, err := open("bob", "inbox", "db.b.>", "first")
	if err != nil || bob.Bound() {
		t.Fatalf("bob's inbox beside alice's: %v (bound %v), want a consumer of his own", err, bob != nil && bob.Bound())
	}
	js := brokertest.JetStream(t, ns.ClientURL())
	for _, owner := range []string{"alice", "bob"} {
		if _, err := js.Consumer(ctx, "O", broker.DurableName(owner, "inbox")); err != nil {
			t.Fatalf("%s's inbox %q: %v", owner, broker.DurableName(owner, "inbox"), err)
		}
	}
	if broker.DurableName("alice", "inbox") == broker.DurableName("bob", "inbox") {
		t.Fatal("two owners, one name")
	}
	if _, err := open("alice", "second", "db.a.>", ""); err != nil {
		t.Fatal(err)
	}
	if _, err := open("alice", "third", "db.a.>", ""); !errors.Is(err, broker.ErrTooManyConsumers) || !strings.Contains(err.Error(), "2") {
		t.Fatalf("alice's third durable: %v, want ErrTooManyConsumers naming the cap", err)
	}
	if again, err := open("alice", "inbox", "db.a.>", ""); err != nil || !again.Bound() {
		t.Fatalf("alice binding her own inbox at the cap: %v", err)
	}
	if _, err := open("alice", "inbox", "db.a.>", "first"); err != nil {
		t.Fatalf("alice moving her own inbox at the cap: %v", err)
	}
	if _, err := open("bob", "second", "db.b.>", ""); err != nil {
		t.Fatalf("bob's second durable: %v", err)
	}
	if err := a.Delete(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := open("alice", "third", "db.a.>", ""); err != nil {
		t.Fatalf("alice's third durable after deleting one: %v", err)
	}
}
