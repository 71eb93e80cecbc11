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
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap/zaptest"
)

func appendTo(ctx context.Context, b *broker.JetStream, out []broker.Outgoing) error {
	return b.Append(ctx, out, broker.AppendOptions{})
}

var _ broker.Appender = (*broker.JetStream)(nil)

// TestJetStreamAppendKeepsOrderThroughFailures is
// TestJetStreamPublishKeepsOrderThroughFailures for Append: a server
// restart, a connection closed, the stream re-created (also without fast
// batches) in the middle of a large Append; the stream then holds every
// event once, in order (a suffix of them when its history was lost).
func TestJetStreamAppendKeepsOrderThroughFailures(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("-short (make test-quick) leaves out the slow tests: make test runs them")
	}
	keepsOrderThroughFailures(t, appendTo, "stream re-created without fast batches", func(c *jetstream.StreamConfig) { c.AllowBatchPublish = false })
}

// appendEvents makes n events e-<from>... with ids.
func appendEvents(from, n int) []broker.Outgoing {
	out := make([]broker.Outgoing, n)
	for i := range out {
		out[i] = broker.Outgoing{Subject: fmt.Sprintf("db.t.%d", (from+i)%7), Data: []byte(fmt.Sprint(from + i)), ID: eventID(from + i)}
	}
	return out
}

// checkStored checks that the ORDER stream holds exactly events e-0 to
// e-<n-1>, in order, once each.
func checkStored(t *testing.T, js jetstream.JetStream, n int) {
	t.Helper()
	ids, apps := storedIDs(t, js)
	if len(apps) != 0 {
		t.Errorf("%d messages outside db.> stored", len(apps))
	}
	if len(ids) != n {
		t.Errorf("%d events stored, want %d", len(ids), n)
	}
	for i, id := range ids {
		if id != eventID(i) {
			t.Fatalf("stored event %d is %s, want %s (stored: ...%v...)", i, id, eventID(i), ids[max(0, i-3):min(len(ids), i+3)])
		}
	}
}

// checkFastBatch checks that the message at stream sequence seq was stored
// by a fast batch (fast), or by an atomic one: the server keeps the
// atomic batch's headers on the messages it stores, a fast batch has none.
func checkFastBatch(t *testing.T, js jetstream.JetStream, seq uint64, fast bool) {
	t.Helper()
	s, err := js.Stream(t.Context(), "ORDER")
	if err != nil {
		t.Fatal(err)
	}
	m, err := s.GetMsg(t.Context(), seq)
	if err != nil {
		t.Fatal(err)
	}
	if atomic := m.Header.Get("Nats-Batch-Id") != ""; atomic == fast {
		t.Errorf("message %d stored with headers %v: want a fast batch %v", seq, m.Header, fast)
	}
}

func appendBroker(t *testing.T) (*broker.JetStream, jetstream.JetStream) {
	t.Helper()
	ns := brokertest.NATS(t)
	b := dialJS(t, broker.JetStreamConfig{NATSConfig: broker.NATSConfig{URL: ns.ClientURL(), Subjects: []string{"db.>", "app.>"}, Logger: zaptest.NewLogger(t)}, Stream: "ORDER"})
	return b, brokertest.JetStream(t, ns.ClientURL())
}

func streamConfig(t *testing.T, js jetstream.JetStream) jetstream.StreamConfig {
	t.Helper()
	s, err := js.Stream(t.Context(), "ORDER")
	if err != nil {
		t.Fatal(err)
	}
	return s.CachedInfo().Config
}

// TestJetStreamAppendRefusedMessage: a message the stream refuses (over
// its max_msg_size) first, in the middle, or last: Append returns its
// error, and the stream holds exactly the events before it.
func TestJetStreamAppendRefusedMessage(t *testing.T) {
	t.Parallel()
	const n, size = 2500, 1000
	for _, bad := range []int{0, 1, 1700, n - 1} {
		t.Run(fmt.Sprint(bad), func(t *testing.T) {
			b, js := appendBroker(t)
			cfg := streamConfig(t, js)
			if !cfg.AllowBatchPublish {
				t.Fatal("the stream was created without allow_batched")
			}
			cfg.MaxMsgSize = size
			if _, err := js.UpdateStream(t.Context(), cfg); err != nil {
				t.Fatal(err)
			}
			out := appendEvents(0, n)
			out[bad].Data = []byte(strings.Repeat("x", 2*size))
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			err := b.Append(ctx, out, broker.AppendOptions{})
			var apiErr *jetstream.APIError
			if !errors.As(err, &apiErr) || apiErr.ErrorCode != 10054 { // JSStreamMessageExceedsMaximumErr
				t.Fatalf("Append = %v, want the stream's message size error", err)
			}
			if !strings.Contains(err.Error(), out[bad].Subject) {
				t.Errorf("the error %q does not name the refused message's subject %s", err, out[bad].Subject)
			}
			checkStored(t, js, bad)
		})
	}
}

// TestJetStreamAppendOverMaxPayload: a message over the server's
// max_payload, which the client library refuses to send: Append ends the
// batch before it and returns the library's error; the stream holds
// exactly the events before it.
func TestJetStreamAppendOverMaxPayload(t *testing.T) {
	t.Parallel()
	for _, bad := range []int{0, 1500} {
		t.Run(fmt.Sprint(bad), func(t *testing.T) {
			b, js := appendBroker(t)
			out := appendEvents(0, 2000)
			out[bad].Data = make([]byte, 2<<20) // the default max_payload is 1 MB
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			if err := b.Append(ctx, out, broker.AppendOptions{}); !errors.Is(err, nats.ErrMaxPayload) {
				t.Fatalf("Append = %v, want %v", err, nats.ErrMaxPayload)
			}
			checkStored(t, js, bad)
			if bad > 0 {
				checkFastBatch(t, js, 1, true)
			}
		})
	}
}

// TestJetStreamAppendRepeated: an Append of events all stored already
// (its answer was lost, say) stores nothing and succeeds; so does one of
// which the first half is stored, storing the second half after it.
func TestJetStreamAppendRepeated(t *testing.T) {
	t.Parallel()
	b, js := appendBroker(t)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	out := appendEvents(0, 3000)
	if err := b.Append(ctx, out[:1500], broker.AppendOptions{}); err != nil {
		t.Fatal(err)
	}
	checkStored(t, js, 1500)
	checkFastBatch(t, js, 1, true)
	if err := b.Append(ctx, out[:1500], broker.AppendOptions{}); err != nil {
		t.Fatalf("repeated Append: %v", err)
	}
	checkStored(t, js, 1500)
	if err := b.Append(ctx, out, broker.AppendOptions{}); err != nil {
		t.Fatalf("Append with its first half stored: %v", err)
	}
	checkStored(t, js, 3000)
	// A known id in the middle, as after a lost answer to part of it.
	more := appendEvents(3000, 1000)
	if err := b.Append(ctx, more[:500], broker.AppendOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := b.Append(ctx, append(appendEvents(2990, 10), more...), broker.AppendOptions{}); err != nil {
		t.Fatalf("Append starting with 10 known events: %v", err)
	}
	checkStored(t, js, 4000)
}

// TestJetStreamAppendWithoutFastBatches: a stream created without
// allow_batched (by an older fanwire) gets it from DialJetStream; one
// re-created without it while the broker runs still takes Append (as
// Publish), in order.
func TestJetStreamAppendWithoutFastBatches(t *testing.T) {
	t.Parallel()
	ns := brokertest.NATS(t)
	js := brokertest.JetStream(t, ns.ClientURL())
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	old := jetstream.StreamConfig{Name: "ORDER", Subjects: []string{"db.>", "app.>"}, Storage: jetstream.FileStorage, Duplicates: 2 * time.Minute, AllowAtomicPublish: true}
	if _, err := js.CreateStream(ctx, old); err != nil {
		t.Fatal(err)
	}
	b := dialJS(t, broker.JetStreamConfig{NATSConfig: broker.NATSConfig{URL: ns.ClientURL(), Subjects: []string{"db.>", "app.>"}, Logger: zaptest.NewLogger(t)}, Stream: "ORDER"})
	if !streamConfig(t, js).AllowBatchPublish {
		t.Fatal("DialJetStream did not turn on allow_batched on the existing stream")
	}
	if err := b.Append(ctx, appendEvents(0, 1500), broker.AppendOptions{}); err != nil {
		t.Fatal(err)
	}
	recreateStream(t, js, func(c *jetstream.StreamConfig) { c.AllowBatchPublish = false })
	if streamConfig(t, js).AllowBatchPublish {
		t.Fatal("the stream was re-created with allow_batched")
	}
	if err := b.Append(ctx, appendEvents(0, 2500), broker.AppendOptions{}); err != nil {
		t.Fatalf("Append to a stream without fast batches: %v", err)
	}
	checkStored(t, js, 2500)
	checkFastBatch(t, js, 1, false)
	if err := b.Append(ctx, appendEvents(2500, 10), broker.AppendOptions{}); err != nil {
		t.Fatal(err)
	}
	checkStored(t, js, 2510)
}

// TestAppendAsksTheFenceBeforeSendingAgain: an append whose batch is not
// acknowledged (the server is down) asks the writer's fence before it
// sends again, and stops with the fence's error: a leader whose lease ran
// out while it waited sends nothing more. Before, it sent again until its
// context ended.
func TestAppendAsksTheFenceBeforeSendingAgain(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("-short (make test-quick) leaves out the slow tests: make test runs them")
	}
	ns := brokertest.NATS(t)
	b := dialJS(t, broker.JetStreamConfig{NATSConfig: broker.NATSConfig{URL: ns.ClientURL(), Subjects: []string{"db.>"}}, Stream: "FENCE"})
	ns.Shutdown()
	ns.WaitForShutdown()
	errFenced := errors.New("the lease ran out")
	asked := 0
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	err := b.Append(ctx, appendEvents(0, 10), broker.AppendOptions{Writer: "w", Fence: func(context.Context) error {
		asked++
		return errFenced
	}})
	if !errors.Is(err, errFenced) || asked != 1 {
		t.Fatalf("append to a server that is down: %v after %d fence checks; want the fence's error after 1", err, asked)
	}
}
