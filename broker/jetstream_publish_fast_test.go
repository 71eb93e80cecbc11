package broker_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fanwire/fanwire/broker"
	"github.com/fanwire/fanwire/broker/brokertest"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"
)

// TestJetStreamPublishCursorsAmongOtherPublishers publishes batches
// without ids (fast batches) from four goroutines on one broker and from
// a second broker, while a plain client publishes single messages on the
// same stream: messages of others come between a batch's. Every cursor
// Publish returns must name the message it published, and some batches
// must have needed the search (the test tested interleaving).
func TestJetStreamPublishCursorsAmongOtherPublishers(t *testing.T) {
	t.Parallel()
	ns := brokertest.NATS(t)
	cfg := broker.JetStreamConfig{NATSConfig: broker.NATSConfig{URL: ns.ClientURL(), Subjects: []string{"app.>"}}, Stream: "CUR"}
	b1, b2 := dialJS(t, cfg), dialJS(t, cfg)
	js := brokertest.JetStream(t, ns.ClientURL())
	ctx := t.Context()

	stop := make(chan struct{})
	var noise sync.WaitGroup
	noise.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := js.Publish(ctx, "app.noise", fmt.Appendf(nil, "noise-%d", i)); err != nil {
				t.Errorf("noise: %v", err)
				return
			}
		}
	})

	type result struct {
		data    []string
		cursors []string
	}
	var mu sync.Mutex
	var results []result
	var pubs sync.WaitGroup
	for g := range 5 {
		b := b1
		if g == 4 {
			b = b2
		}
		pubs.Go(func() {
			for batch := range 20 {
				out := make([]broker.Outgoing, 50)
				data := make([]string, len(out))
				for i := range out {
					data[i] = fmt.Sprintf("g%d-b%d-m%d", g, batch, i)
					out[i] = broker.Outgoing{Subject: fmt.Sprintf("app.g%d", g), Data: []byte(data[i])}
				}
				cursors, err := b.Publish(ctx, out)
				if err != nil {
					t.Errorf("publisher %d batch %d: %v", g, batch, err)
					return
				}
				mu.Lock()
				results = append(results, result{data, cursors})
				mu.Unlock()
			}
		})
	}
	pubs.Wait()
	close(stop)
	noise.Wait()

	s, err := js.Stream(ctx, "CUR")
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, r := range results {
		for i, c := range r.cursors {
			if seen[c] {
				t.Fatalf("cursor %s returned twice", c)
			}
			seen[c] = true
			seq, err := broker.ParseJSCursor(c)
			if err != nil {
				t.Fatal(err)
			}
			m, err := s.GetMsg(ctx, seq)
			if err != nil {
				t.Fatalf("%s: %v", c, err)
			}
			if string(m.Data) != r.data[i] {
				t.Fatalf("cursor %s of %q names %q", c, r.data[i], m.Data)
			}
		}
	}
	if len(seen) != 5*20*50 {
		t.Fatalf("%d cursors, want %d", len(seen), 5*20*50)
	}
	t.Logf("%d of 100 batches searched for their sequences", broker.PublishFinds(b1)+broker.PublishFinds(b2))
}

// TestJetStreamPublishCursorsAroundAnotherMessage makes certain that
// another publisher's message is stored between a fast batch's first and
// second: Publish must search for its messages, and its cursors skip the
// other one.
func TestJetStreamPublishCursorsAroundAnotherMessage(t *testing.T) {
	t.Parallel()
	ns := brokertest.NATS(t)
	b := dialJS(t, broker.JetStreamConfig{NATSConfig: broker.NATSConfig{URL: ns.ClientURL(), Subjects: []string{"app.>"}}, Stream: "CUR"})
	js := brokertest.JetStream(t, ns.ClientURL())
	ctx := t.Context()
	s, err := js.Stream(ctx, "CUR")
	if err != nil {
		t.Fatal(err)
	}
	broker.SetPublishHooks(b, func() {
		// The batch's first message is sent: once it is stored, another
		// publisher's goes next.
		for {
			if _, err := s.GetLastMsgForSubject(ctx, "app.batch"); err == nil {
				break
			}
		}
		if _, err := js.Publish(ctx, "app.other", []byte("other")); err != nil {
			t.Error(err)
		}
	})
	out := []broker.Outgoing{{Subject: "app.batch", Data: []byte("0")}, {Subject: "app.batch", Data: []byte("1")}, {Subject: "app.batch", Data: []byte("2")}}
	cursors, err := b.Publish(ctx, out)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"js:1", "js:3", "js:4"}; !slices.Equal(cursors, want) {
		t.Fatalf("cursors %v, want %v (the other message at js:2)", cursors, want)
	}
	if n := broker.PublishFinds(b); n != 1 {
		t.Fatalf("%d searches, want 1", n)
	}
}

// TestJetStreamPublishCursorsOfRemovedMessages publishes a batch larger
// than the stream keeps (max_bytes): its first messages are removed before
// Publish reads them back. The cursors of those still there name them; the
// others are below the stream's first sequence, in order (expired, as
// their messages are).
func TestJetStreamPublishCursorsOfRemovedMessages(t *testing.T) {
	t.Parallel()
	ns := brokertest.NATS(t)
	b := dialJS(t, broker.JetStreamConfig{NATSConfig: broker.NATSConfig{URL: ns.ClientURL(), Subjects: []string{"x.>"}}, Stream: "SMALL", MaxBytes: 64 << 10})
	ctx := t.Context()
	pad := strings.Repeat("p", 200)
	out := make([]broker.Outgoing, 500)
	for i := range out {
		out[i] = broker.Outgoing{Subject: "x.y", Data: fmt.Appendf(nil, `{"i":%d,"pad":%q}`, i, pad)}
	}
	cursors, err := b.Publish(ctx, out)
	if err != nil {
		t.Fatal(err)
	}
	js := brokertest.JetStream(t, ns.ClientURL())
	s, err := js.Stream(ctx, "SMALL")
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.FirstSeq <= 1 {
		t.Fatalf("first sequence %d: nothing was removed, the test did not test removal", info.State.FirstSeq)
	}
	var prev uint64
	present := 0
	for i, c := range cursors {
		seq, err := broker.ParseJSCursor(c)
		if err != nil {
			t.Fatal(err)
		}
		if seq <= prev {
			t.Fatalf("cursor %d (%s) not after the one before (%d)", i, c, prev)
		}
		prev = seq
		if seq < info.State.FirstSeq {
			continue
		}
		present++
		m, err := s.GetMsg(ctx, seq)
		if err != nil {
			t.Fatal(err)
		}
		if string(m.Data) != string(out[i].Data) {
			t.Fatalf("cursor %s of message %d names %q", c, i, m.Data)
		}
	}
	if present == 0 || uint64(present) != info.State.Msgs {
		t.Fatalf("%d cursors name stored messages, the stream holds %d", present, info.State.Msgs)
	}
}

// TestJetStreamPublishWithoutIDsKeepsOrderThroughFailures publishes
// batches of events without ids (fast batches) while the broker fails in
// the middle: the server restarts, the connection is cut, or the leader of
// an R3 stream on a 3-node cluster steps down. Another publisher adds
// events meanwhile. A batch whose outcome the failure made unknown fails
// (it cannot be sent again without risking a repeat); the next ones go on.
// The stream must then hold, of each batch, a prefix (all of it when
// Publish returned its cursors), in publish order: never event k+1 without
// k. Each cursor returned names its event.
func TestJetStreamPublishWithoutIDsKeepsOrderThroughFailures(t *testing.T) {
	t.Parallel()
	const batches, size = 40, 150
	for _, tc := range []struct {
		name     string
		replicas int
		// setup starts the servers; fail fails them and returns a URL to
		// read the stream at afterwards.
		setup func(t *testing.T) (url string, fail func() string)
	}{
		{"server restart", 1, func(t *testing.T) (string, func() string) {
			ns := brokertest.NATS(t)
			return ns.ClientURL(), func() string { return brokertest.RestartNATS(t, ns).ClientURL() }
		}},
		{"connection closed by the server", 1, func(t *testing.T) (string, func() string) {
			ns := brokertest.NATS(t)
			return ns.ClientURL(), func() string {
				kickClient(t, ns, "publisher")
				return ns.ClientURL()
			}
		}},
		{"stream leader change", 3, func(t *testing.T) (string, func() string) {
			nodes := brokertest.NATSCluster(t, 3)
			url := nodes[0].ClientURL() + "," + nodes[1].ClientURL() + "," + nodes[2].ClientURL()
			return url, func() string {
				resp, err := brokertest.JetStream(t, url).Conn().Request("$JS.API.STREAM.LEADER.STEPDOWN.ORDER", nil, 5*time.Second)
				if err != nil {
					t.Fatalf("step down: %v", err)
				}
				t.Logf("stepped down: %s", resp.Data)
				return url
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			url, fail := tc.setup(t)
			// The publisher's connection goes through a gate that holds it
			// in the middle of batch 20 until the failure has happened:
			// the failure comes in the middle of a batch for certain.
			gate := startPublishGate(t, strings.TrimPrefix(strings.Split(url, ",")[0], "nats://"), batches/2*size+size/2)
			b := dialJS(t, broker.JetStreamConfig{NATSConfig: broker.NATSConfig{URL: "nats://" + gate.Addr(), Subjects: []string{"db.>", "app.>"}, Name: "publisher", Logger: zaptest.NewLogger(t)}, Stream: "ORDER", Replicas: tc.replicas})
			other := startOtherPublisher(t, url)
			ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
			defer cancel()
			cursors := make([][]string, batches)
			failed := 0
			published := make(chan struct{})
			go func() {
				defer close(published)
				for k := range batches {
					out := make([]broker.Outgoing, size)
					for i := range out {
						out[i] = broker.Outgoing{Subject: fmt.Sprintf("db.t.%d", i%7), Data: []byte(fmt.Sprint(k*size + i))}
					}
					c, err := b.Publish(ctx, out)
					if err != nil {
						failed++
						t.Logf("batch %d: %v", k, err)
						continue
					}
					cursors[k] = c
				}
			}()
			select {
			case <-gate.held:
			case <-published:
				t.Fatal("every batch was published before the gate held one")
			}
			after := fail()
			close(gate.release)
			<-published
			other.stop(t)
			stored := storedData(t, brokertest.JetStream(t, after))
			checkBatchPrefixes(t, stored, cursors, size)
			t.Logf("%d events stored, %d of %d batches failed", len(stored), failed, batches)
		})
	}
}

// checkBatchPrefixes checks the events stored (numbered from 0, size to a
// batch) against the batches' cursors (nil: the batch failed): in order,
// of each batch a prefix, all of an acknowledged one, each at its cursor.
func checkBatchPrefixes(t *testing.T, stored []storedMsg, cursors [][]string, size int) {
	t.Helper()
	prev, batch, next := -1, -1, 0 // the last event seen, its batch, and the batch's next place
	for _, s := range stored {
		e, _ := strconv.Atoi(s.data)
		if e <= prev {
			t.Fatalf("event %d stored after %d", e, prev)
		}
		k, place := e/size, e%size
		if k != batch {
			if batch >= 0 && cursors[batch] != nil && next != size {
				t.Fatalf("batch %d acknowledged, but only %d of its events stored", batch, next)
			}
			batch, next = k, 0
		}
		if place != next {
			t.Fatalf("event %d stored after event %d of its batch: a gap", e, k*size+next-1)
		}
		next++
		prev = e
		if cursors[k] != nil && cursors[k][place] != broker.FormatJSCursor(s.seq) {
			t.Fatalf("event %d at %s, its cursor %s", e, broker.FormatJSCursor(s.seq), cursors[k][place])
		}
	}
	if batch >= 0 && cursors[batch] != nil && next != size {
		t.Fatalf("batch %d acknowledged, but only %d of its events stored", batch, next)
	}
	for k, c := range cursors {
		if c != nil && !slices.ContainsFunc(stored, func(s storedMsg) bool { return s.data == fmt.Sprint(k*size) }) {
			t.Fatalf("batch %d acknowledged, not stored", k)
		}
	}
}

type storedMsg struct {
	seq  uint64
	data string
}

// storedData reads the ORDER stream's events on db.>, in order.
func storedData(t *testing.T, js jetstream.JetStream) []storedMsg {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, "ORDER")
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var out []storedMsg
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasPrefix(m.Subject, "db.") {
			out = append(out, storedMsg{seq, string(m.Data)})
		}
	}
	return out
}

// TestJetStreamPublishReadBackBounded publishes a fast batch on a stream
// with max_msgs_per_subject 1 that holds 10,000 older messages: the
// batch's earlier messages on a subject are removed by its later ones, so
// Publish does not find them where it looks first and reads the stream
// back; other messages come between the batch's. It must read back no
// further than what was stored since the broker last saw the stream's end
// before the batch (at dial; then through its live feed, after 10,000 more
// from another publisher), not down to the stream's first message; the
// found messages get their cursors, the removed ones cursors below them.
func TestJetStreamPublishReadBackBounded(t *testing.T) {
	t.Parallel()
	ns := brokertest.NATS(t)
	js := brokertest.JetStream(t, ns.ClientURL())
	ctx := t.Context()
	s, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "PER", Subjects: []string{"x.>"}, Storage: jetstream.MemoryStorage,
		MaxMsgsPerSubject: 1, AllowAtomicPublish: true, AllowBatchPublish: true})
	if err != nil {
		t.Fatal(err)
	}
	older := func(prefix string) {
		t.Helper()
		// 1,000 in flight at most: past 4,000 unacknowledged, PublishAsync
		// waits 200 ms for acks and then fails (a loaded run did).
		for i := range 10_000 {
			if _, err := js.PublishAsync(fmt.Sprintf("x.%s.%d", prefix, i), []byte("old")); err != nil {
				t.Fatal(err)
			}
			if i%1000 != 999 {
				continue
			}
			select {
			case <-js.PublishAsyncComplete():
			case <-time.After(30 * time.Second):
				t.Fatal("older messages not acknowledged")
			}
		}
	}
	older("a")
	b := dialJS(t, broker.JetStreamConfig{NATSConfig: broker.NATSConfig{URL: ns.ClientURL(), Subjects: []string{"x.>"}}, Stream: "PER", Storage: "memory"})
	const others = 3
	var first string // the data of the batch's first message
	broker.SetPublishHooks(b, func() {
		// The batch's first message is sent: once it is stored, others
		// come next.
		for {
			if m, err := s.GetLastMsgForSubject(ctx, "x.batch.a"); err == nil && string(m.Data) == first {
				break
			}
		}
		for i := range others {
			if _, err := js.Publish(ctx, fmt.Sprintf("x.other.%d", i), []byte("other")); err != nil {
				t.Error(err)
			}
		}
	})
	// x.batch.a thrice then once more: only its last stays, and x.batch.b.
	subjects := []string{"x.batch.a", "x.batch.a", "x.batch.a", "x.batch.b", "x.batch.a"}
	check := func(round string) {
		t.Helper()
		out := make([]broker.Outgoing, len(subjects))
		for i, subj := range subjects {
			out[i] = broker.Outgoing{Subject: subj, Data: fmt.Appendf(nil, "%s-%d", round, i)}
		}
		first = string(out[0].Data)
		info, err := s.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		before, reads, finds := info.State.LastSeq, broker.PublishTagReads(b), broker.PublishFinds(b)
		cursors, err := b.Publish(ctx, out)
		if err != nil {
			t.Fatal(err)
		}
		reads = broker.PublishTagReads(b) - reads
		if broker.PublishFinds(b) != finds+1 {
			t.Fatalf("%s: %d searches, want 1", round, broker.PublishFinds(b)-finds)
		}
		// The first read, then at most the batch's and the others'.
		if limit := int64(1 + len(out) + others); reads > limit {
			t.Fatalf("%s: %d messages read back for a batch of %d among %d others on a stream of %d: want at most %d", round, reads, len(out), others, before, limit)
		}
		seqs := make([]uint64, len(cursors))
		for i, c := range cursors {
			if seqs[i], err = broker.ParseJSCursor(c); err != nil {
				t.Fatal(err)
			}
			if i > 0 && seqs[i] <= seqs[i-1] {
				t.Fatalf("%s: cursors %v not increasing", round, cursors)
			}
		}
		if seqs[0] <= before {
			t.Fatalf("%s: cursors %v, but the stream was at %d before the batch", round, cursors, before)
		}
		for _, i := range []int{3, 4} { // the stored ones
			m, err := s.GetMsg(ctx, seqs[i])
			if err != nil || string(m.Data) != string(out[i].Data) {
				t.Fatalf("%s: message %d at %s: %v %v, want %q", round, i, cursors[i], m, err, out[i].Data)
			}
		}
		t.Logf("%s: %d messages read back, cursors %v after %d", round, reads, cursors, before)
	}
	check("at dial")
	c := consume(t, b)
	older("b")
	c.waitFor(t, 10_000)
	check("after the live feed")
}

// TestJetStreamPublishNoRespondersMidBatch stops JetStream on the server
// once a fast batch's first message is stored, as a server shutting down
// does before it closes its connections: the batch's later messages get
// "no responders". That answer was taken for "nothing stored", and
// Publish sent the whole batch again once the stream was back: its first
// event was stored twice (a loaded run of
// TestJetStreamPublishWithoutIDsKeepsOrderThroughFailures/server_restart:
// "event 2850 at js:2935, its cursor js:3041"). Without ids, a batch
// whose outcome is unknown fails: the stream holds each event once.
func TestJetStreamPublishNoRespondersMidBatch(t *testing.T) {
	t.Parallel()
	ns := brokertest.NATS(t)
	core, logs := observer.New(zap.WarnLevel)
	b := dialJS(t, broker.JetStreamConfig{NATSConfig: broker.NATSConfig{URL: ns.ClientURL(), Subjects: []string{"db.>"}, Logger: zap.New(core)}, Stream: "ORDER"})
	js := brokertest.JetStream(t, ns.ClientURL())
	jsCfg := ns.JetStreamConfig() // to enable it again, on the same store
	jsCfg.StoreDir = brokertest.StoreDir(ns)
	var once sync.Once
	broker.SetPublishHooks(b, func() {
		once.Do(func() {
			waitStored(t, js, 1)
			if err := ns.DisableJetStream(); err != nil {
				t.Error(err)
			}
		})
	})
	out := make([]broker.Outgoing, 10)
	for i := range out {
		out[i] = broker.Outgoing{Subject: "db.t", Data: []byte(fmt.Sprint(i))}
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	type result struct {
		cursors []string
		err     error
	}
	published := make(chan result, 1)
	go func() {
		c, err := b.Publish(ctx, out)
		published <- result{c, err}
	}()
	// JetStream comes back once Publish has given up, or is sending again.
	var r result
	var got bool
	for !got && logs.FilterMessageSnippet("sending again").Len() == 0 {
		select {
		case r = <-published:
			got = true
		case <-time.After(10 * time.Millisecond):
		}
	}
	if err := ns.EnableJetStream(jsCfg); err != nil {
		t.Fatal(err)
	}
	if !got {
		r = <-published
	}
	stored := storedData(t, js)
	cursors := [][]string{r.cursors}
	if r.err != nil {
		cursors = [][]string{nil}
	}
	t.Logf("publish: %v; %d events stored", r.err, len(stored))
	checkBatchPrefixes(t, stored, cursors, len(out))
	if len(stored) == 0 {
		t.Fatal("nothing stored: the test did not stop JetStream after the first message")
	}
}
