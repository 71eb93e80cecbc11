package broker_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fanwire/fanwire/broker"
	"github.com/fanwire/fanwire/broker/brokertest"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap/zaptest"
)

// TestJetStreamPublishKeepsOrderThroughFailures fails the broker in the
// middle of a large Publish, several times per kind of failure, and checks
// that the stream then holds the published events in publish order, with
// no gap and no duplicate: all of them when the stream survives, a suffix
// of them when it was deleted (its history is gone), never event k after
// event k+1. Another publisher adds events on app.> meanwhile, as the
// gateway's HTTP publish does: they may sit between ours, and are all
// stored once.
func TestJetStreamPublishKeepsOrderThroughFailures(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("-short (make test-quick) leaves out the slow tests: make test runs them")
	}
	publish := func(ctx context.Context, b *broker.JetStream, out []broker.Outgoing) error {
		_, err := b.Publish(ctx, out)
		return err
	}
	keepsOrderThroughFailures(t, publish, "stream re-created without atomic batches", func(c *jetstream.StreamConfig) { c.AllowAtomicPublish = false })
}

// keepsOrderThroughFailures is TestJetStreamPublishKeepsOrderThroughFailures
// for publish (Publish or Append); the last case re-creates the stream
// with change applied to its config (a feature turned off), under name.
func keepsOrderThroughFailures(t *testing.T, publish func(context.Context, *broker.JetStream, []broker.Outgoing) error, name string, change func(*jetstream.StreamConfig)) {
	const n = 6000
	for _, tc := range []struct {
		name   string
		suffix bool // the stream's earlier history is lost: a suffix of the events is stored
		fail   func(t *testing.T, ns *server.Server, js jetstream.JetStream) *server.Server
	}{
		{"server restart", false, func(t *testing.T, ns *server.Server, _ jetstream.JetStream) *server.Server {
			return brokertest.RestartNATS(t, ns)
		}},
		{"connection closed by the server", false, func(t *testing.T, ns *server.Server, _ jetstream.JetStream) *server.Server {
			kickClient(t, ns, "publisher")
			return ns
		}},
		{"stream deleted and re-created", true, func(t *testing.T, ns *server.Server, js jetstream.JetStream) *server.Server {
			recreateStream(t, js, func(*jetstream.StreamConfig) {})
			return ns
		}},
		{name, true, func(t *testing.T, ns *server.Server, js jetstream.JetStream) *server.Server {
			recreateStream(t, js, change)
			return ns
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for run := range 3 {
				t.Run(fmt.Sprint(run), func(t *testing.T) {
					ns := brokertest.NATS(t)
					url := ns.ClientURL()
					// The publisher goes through a gate that holds it after
					// it has sent a share of the events, until the broker
					// has failed: the failure comes in the middle, however
					// fast the publish (a fast batch's 6,000 events once
					// ended before a poll of the stream saw a quarter of
					// them, and the stream deleted after it held nothing).
					holdAt := n/4 + run*n/8
					gate := startPublishGate(t, ns.Addr().String(), holdAt)
					b := dialJS(t, broker.JetStreamConfig{NATSConfig: broker.NATSConfig{URL: "nats://" + gate.Addr(), Subjects: []string{"db.>", "app.>"}, Name: "publisher", Logger: zaptest.NewLogger(t)}, Stream: "ORDER"})
					out := make([]broker.Outgoing, n)
					for i := range out {
						out[i] = broker.Outgoing{Subject: fmt.Sprintf("db.t.%d", i%7), Data: []byte(fmt.Sprint(i)), ID: eventID(i)}
					}
					ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
					defer cancel()
					published := make(chan error, 1)
					go func() { published <- publish(ctx, b, out) }()
					other := startOtherPublisher(t, url)
					js := brokertest.JetStream(t, url)
					select {
					case <-gate.held:
					case err := <-published:
						t.Fatalf("Publish ended (%v) before the gate held it", err)
					}
					// Some of what went before the gate is stored, some may
					// be in flight still.
					waitStored(t, js, uint64(holdAt/2))
					ns = tc.fail(t, ns, js)
					close(gate.release)
					if err := <-published; err != nil {
						t.Fatalf("Publish: %v", err)
					}
					apps := other.stop(t)
					ids, appIDs := storedIDs(t, brokertest.JetStream(t, ns.ClientURL()))
					first := 0
					if tc.suffix && len(ids) > 0 {
						fmt.Sscanf(ids[0], "e-%d", &first)
					}
					if len(ids) != n-first {
						t.Errorf("%d events stored from %s on, want %d (every one after it, once)", len(ids), eventID(first), n-first)
					}
					for i, id := range ids {
						if id != eventID(first+i) {
							t.Fatalf("stored event %d is %s, want %s (stored order: ...%v...)", i, id, eventID(first+i), ids[max(0, i-3):min(len(ids), i+3)])
						}
					}
					if !tc.suffix && first != 0 {
						t.Errorf("the stream kept its history, yet starts at %s", eventID(first))
					}
					// The last one may be stored unacknowledged, when stopped.
					if seen := map[string]bool{}; !tc.suffix && (len(appIDs) < apps || len(appIDs) > apps+1) {
						t.Errorf("%d of the other publisher's events stored, %d acknowledged", len(appIDs), apps)
					} else {
						for _, id := range appIDs {
							if seen[id] {
								t.Errorf("the other publisher's %s stored twice", id)
							}
							seen[id] = true
						}
					}
					t.Logf("%d events stored from %s on, %d of the other publisher's among them", len(ids), eventID(first), len(appIDs))
				})
			}
		})
	}
}

func eventID(i int) string { return fmt.Sprintf("e-%06d", i) }

// waitStored polls the stream until it holds at least n messages.
func waitStored(t *testing.T, js jetstream.JetStream, n uint64) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		s, err := js.Stream(ctx, "ORDER")
		var last uint64
		if err == nil {
			var info *jetstream.StreamInfo
			if info, err = s.Info(ctx); err == nil {
				last = info.State.LastSeq
			}
		}
		cancel()
		if last >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("stream holds %d messages after 30s, want %d (%v)", last, n, err)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// kickClient closes, on the server's side, the connection of the client
// named name.
func kickClient(t *testing.T, ns *server.Server, name string) {
	t.Helper()
	cz, err := ns.Connz(&server.ConnzOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cz.Conns {
		if c.Name == name {
			if err := ns.DisconnectClientByID(c.Cid); err != nil {
				t.Fatal(err)
			}
			return
		}
	}
	t.Fatalf("no connection named %q", name)
}

// recreateStream deletes the ORDER stream and creates it again at once,
// as another node (or an operator) would, with its config changed by change.
func recreateStream(t *testing.T, js jetstream.JetStream, change func(*jetstream.StreamConfig)) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, "ORDER")
	if err != nil {
		t.Fatal(err)
	}
	cfg := s.CachedInfo().Config
	change(&cfg)
	if err := js.DeleteStream(ctx, "ORDER"); err != nil {
		t.Fatal(err)
	}
	// The publisher re-creates a stream it finds missing, so this create
	// races its own. Whichever wins, the stream must end up with cfg:
	// when the publisher's won, cfg is applied as an update. A create that
	// meets the other one half-way fails in nats-server with "error
	// creating store for stream" (10049) and is asked again.
	for {
		_, err := js.CreateStream(ctx, cfg)
		if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			_, err = js.UpdateStream(ctx, cfg)
		}
		if err == nil {
			return
		}
		var apiErr *jetstream.APIError
		if !errors.As(err, &apiErr) || apiErr.ErrorCode != 10049 || ctx.Err() != nil {
			t.Fatal(err)
		}
		t.Logf("re-creating the stream raced the publisher's: %v; again", err)
	}
}

// storedIDs reads the whole ORDER stream and returns the publish ids of
// its db.> messages and of its app.> messages, in stream order.
func storedIDs(t *testing.T, js jetstream.JetStream) (db, app []string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	// The first API request after a stream's leader changed can go
	// unanswered (seen after a fast batch met a step-down: the next one,
	// a moment later, is answered at once): ask again, a few seconds each.
	var s jetstream.Stream
	var info *jetstream.StreamInfo
	for {
		actx, acancel := context.WithTimeout(ctx, 3*time.Second)
		var err error
		if s, err = js.Stream(actx, "ORDER"); err == nil {
			info, err = s.Info(actx)
		}
		acancel()
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			t.Fatal(err)
		}
	}
	if info.State.Msgs == 0 {
		return nil, nil
	}
	cons, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	for uint64(len(db)+len(app)) < info.State.Msgs {
		left := int(info.State.Msgs) - len(db) - len(app)
		msgs, err := cons.Fetch(min(left, 1000), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		got := false
		for m := range msgs.Messages() {
			got = true
			id := m.Headers().Get(jetstream.MsgIDHeader)
			if len(m.Subject()) > 3 && m.Subject()[:3] == "db." {
				db = append(db, id)
			} else {
				app = append(app, id)
			}
		}
		if !got {
			// A replicated stream that just changed leader answers "no
			// responders" for a moment: the ordered consumer takes up
			// where it was on the next fetch.
			if ctx.Err() != nil {
				t.Fatalf("reading the stream: %v after %d of %d messages", msgs.Error(), len(db)+len(app), info.State.Msgs)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return db, app
}

// otherPublisher publishes events on app.x, one at a time, until stopped:
// another publisher on the same stream.
type otherPublisher struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
	stored atomic.Int64 // acknowledged events
}

func startOtherPublisher(t *testing.T, url string) *otherPublisher {
	t.Helper()
	js := brokertest.JetStream(t, url)
	ctx, cancel := context.WithCancel(t.Context())
	p := &otherPublisher{cancel: cancel}
	p.wg.Go(func() {
		for i := 0; ctx.Err() == nil; i++ {
			actx, acancel := context.WithTimeout(ctx, 2*time.Second)
			// Each one with an id: sent again until acknowledged, stored once.
			for ctx.Err() == nil {
				_, err := js.Publish(actx, "app.x", nil, jetstream.WithMsgID(fmt.Sprintf("app-%d", i)))
				if err == nil {
					p.stored.Add(1)
					break
				}
				if errors.Is(err, context.DeadlineExceeded) {
					acancel()
					actx, acancel = context.WithTimeout(ctx, 2*time.Second)
				}
				select {
				case <-ctx.Done():
				case <-time.After(10 * time.Millisecond):
				}
			}
			acancel()
			select { // about 500 a second, a busy gateway's share
			case <-ctx.Done():
			case <-time.After(2 * time.Millisecond):
			}
		}
	})
	t.Cleanup(p.cancel)
	t.Cleanup(p.wg.Wait)
	return p
}

// stop stops the publisher and returns how many of its events were
// acknowledged.
func (p *otherPublisher) stop(t *testing.T) int {
	t.Helper()
	p.cancel()
	p.wg.Wait()
	return int(p.stored.Load())
}

// TestJetStreamPublishKeepsOrderThroughLeaderChange: on a 3-node cluster,
// the leader of an R3 stream steps down in the middle of a large Publish
// (batches staged with the old leader are dropped; the new one must not
// store a later batch before them). The stream then holds every event
// once, in publish order.
func TestJetStreamPublishKeepsOrderThroughLeaderChange(t *testing.T) {
	t.Parallel()
	keepsOrderThroughLeaderChange(t, func(ctx context.Context, b *broker.JetStream, out []broker.Outgoing) error {
		_, err := b.Publish(ctx, out)
		return err
	})
}

// TestJetStreamAppendKeepsOrderThroughLeaderChange is
// TestJetStreamPublishKeepsOrderThroughLeaderChange for Append: the fast
// batch in flight meets a new leader.
func TestJetStreamAppendKeepsOrderThroughLeaderChange(t *testing.T) {
	t.Parallel()
	keepsOrderThroughLeaderChange(t, appendTo)
}

func keepsOrderThroughLeaderChange(t *testing.T, publish func(context.Context, *broker.JetStream, []broker.Outgoing) error) {
	const n = 5000
	nodes := brokertest.NATSCluster(t, 3)
	url := nodes[0].ClientURL() + "," + nodes[1].ClientURL() + "," + nodes[2].ClientURL()
	js := brokertest.JetStream(t, url)
	for run := range 2 {
		// The publisher's connection goes through a gate that holds it a
		// third of the way through the run until the leader has stepped
		// down: the change comes in the middle of the publish for
		// certain, however fast it is.
		gate := startPublishGate(t, strings.TrimPrefix(nodes[0].ClientURL(), "nats://"), n/3)
		b := dialJS(t, broker.JetStreamConfig{NATSConfig: broker.NATSConfig{URL: "nats://" + gate.Addr(), Subjects: []string{"db.>", "app.>"}}, Stream: "ORDER", Replicas: 3})
		out := make([]broker.Outgoing, n)
		for i := range out {
			out[i] = broker.Outgoing{Subject: fmt.Sprintf("db.t.%d", i%7), Data: []byte(fmt.Sprint(i)), ID: eventID(run*n + i)}
		}
		ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
		published := make(chan error, 1)
		go func() { published <- publish(ctx, b, out) }()
		select {
		case <-gate.held:
		case err := <-published:
			t.Fatalf("run %d: the publish ended (%v) before the gate held it", run, err)
		}
		resp, err := js.Conn().Request("$JS.API.STREAM.LEADER.STEPDOWN.ORDER", nil, 5*time.Second)
		if err != nil {
			t.Fatalf("step down: %v", err)
		}
		t.Logf("run %d: stepped down: %s", run, resp.Data)
		close(gate.release)
		err = <-published
		cancel()
		if err != nil {
			t.Fatalf("publish: %v", err)
		}
	}
	ids, _ := storedIDs(t, js)
	if len(ids) != 2*n {
		t.Errorf("%d events stored, want %d", len(ids), 2*n)
	}
	for i, id := range ids {
		if id != eventID(i) {
			t.Fatalf("stored event %d is %s, want %s (stored order: ...%v...)", i, id, eventID(i), ids[max(0, i-3):min(len(ids), i+3)])
		}
	}
}

// TestJetStreamPublishLostBatchAnswer loses the server's answer to a
// batch it stored (the connection drops as the answer comes): with ids,
// Publish sends it again (an atomic batch) and the repeats are recognized,
// each event stored once, in order; without (a fast batch), it cannot
// tell, and returns an error rather than store events twice: the stream
// holds a prefix of them.
func TestJetStreamPublishLostBatchAnswer(t *testing.T) {
	t.Parallel()
	lostBatchAnswer(t, false, func(ctx context.Context, b *broker.JetStream, out []broker.Outgoing) error {
		_, err := b.Publish(ctx, out)
		return err
	})
}

// TestJetStreamAppendLostBatchAnswer is TestJetStreamPublishLostBatchAnswer
// for Append: the first answer to a fast batch (a flow ack) is lost with
// the connection. With ids, every event is stored once, in order; without,
// Append fails, and the stream holds a prefix of them.
func TestJetStreamAppendLostBatchAnswer(t *testing.T) {
	t.Parallel()
	lostBatchAnswer(t, false, appendTo)
}

// lostBatchAnswer is TestJetStreamPublishLostBatchAnswer for publish,
// which sends atomic batches (all or nothing stored) or not (a prefix).
func lostBatchAnswer(t *testing.T, atomic bool, publish func(context.Context, *broker.JetStream, []broker.Outgoing) error) {
	for _, withIDs := range []bool{true, false} {
		t.Run(fmt.Sprint("ids=", withIDs), func(t *testing.T) {
			ns := brokertest.NATS(t)
			p := startCuttingProxy(t, ns.Addr().String(), func(chunk []byte) bool { return bytes.Contains(chunk, []byte("MSG _INBOX.")) })
			b := dialJS(t, broker.JetStreamConfig{NATSConfig: broker.NATSConfig{URL: "nats://" + p.Addr(), Subjects: []string{"db.>", "app.>"}}, Stream: "ORDER"})
			out := make([]broker.Outgoing, 500)
			for i := range out {
				out[i] = broker.Outgoing{Subject: "db.t", Data: []byte(fmt.Sprint(i))}
				if withIDs {
					out[i].ID = eventID(i)
				}
			}
			p.cut.Store(true)
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			err := publish(ctx, b, out)
			if p.cut.Load() {
				t.Fatal("no answer was cut: the test did not test a lost answer")
			}
			if withIDs && err != nil {
				t.Fatalf("publish with ids: %v", err)
			}
			if !withIDs && err == nil {
				t.Fatal("publish without ids succeeded after its answer was lost: it sent the batch again")
			}
			js := brokertest.JetStream(t, ns.ClientURL())
			s, err := js.Stream(ctx, "ORDER")
			if err != nil {
				t.Fatal(err)
			}
			info, err := s.Info(ctx)
			if err != nil {
				t.Fatal(err)
			}
			switch {
			case !withIDs && !atomic:
				// A fast batch stores its messages as they come: the
				// connection lost, a prefix of them is stored, once.
				if info.State.Msgs > uint64(len(out)) {
					t.Errorf("%d messages stored, want at most %d (a prefix of the batch)", info.State.Msgs, len(out))
				}
				for seq := uint64(1); seq <= info.State.Msgs; seq++ {
					m, err := s.GetMsg(ctx, seq)
					if err != nil {
						t.Fatal(err)
					}
					if string(m.Data) != fmt.Sprint(seq-1) {
						t.Fatalf("message %d is %q, want %d (a prefix of the batch, in order)", seq, m.Data, seq-1)
					}
				}
				t.Logf("%d of %d messages stored", info.State.Msgs, len(out))
			case info.State.Msgs != uint64(len(out)):
				t.Errorf("%d messages stored, want %d (the batch once)", info.State.Msgs, len(out))
			}
			if withIDs {
				ids, _ := storedIDs(t, js)
				for i, id := range ids {
					if id != eventID(i) {
						t.Fatalf("stored event %d is %s, want %s", i, id, eventID(i))
					}
				}
			}
		})
	}
}

// publishGate forwards a publisher's connection to a NATS server and holds
// it (forwards nothing more from it) once it has sent holdAt messages on
// db. subjects, until release is closed: a failure the test injects then
// comes in the middle of the publish for certain.
type publishGate struct {
	*brokertest.Proxy
	held    chan struct{} // closed when the gate holds
	release chan struct{} // closed by the test: forward again
}

func startPublishGate(t *testing.T, server string, holdAt int) *publishGate {
	t.Helper()
	g := &publishGate{held: make(chan struct{}), release: make(chan struct{})}
	var sent atomic.Int64 // across the publisher's connections
	g.Proxy = brokertest.StartProxy(t, server, brokertest.ProxyConfig{ToServer: clientPublishes(func(ctx context.Context, subject string) bool {
		if strings.HasPrefix(subject, "db.") && sent.Add(1) == int64(holdAt) {
			close(g.held)
			select {
			case <-g.release:
			case <-ctx.Done(): // the test ends
				return false
			}
		}
		return true
	})})
	return g
}
