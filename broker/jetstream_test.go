package broker_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fanwire/fanwire/broker"
	"github.com/fanwire/fanwire/broker/brokertest"
	"github.com/nats-io/nats.go/jetstream"
)

func dialJS(t *testing.T, cfg broker.JetStreamConfig) *broker.JetStream {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	b, err := broker.DialJetStream(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b
}

func TestJetStreamPublishConsumeWithCursors(t *testing.T) {
	t.Parallel()
	ns := brokertest.NATS(t)
	b := dialJS(t, broker.JetStreamConfig{NATSConfig: broker.NATSConfig{URL: ns.ClientURL(), Subjects: []string{"db.>", "app.>"}}, Stream: "T1"})
	// Stored before the consumer starts: not delivered (live from the node's start).
	if _, err := b.Publish(context.Background(), []broker.Outgoing{{Subject: "app.old", Data: []byte(`0`)}}); err != nil {
		t.Fatal(err)
	}
	c := consume(t, b)
	var out []broker.Outgoing
	for i := range 300 {
		out = append(out, broker.Outgoing{Subject: fmt.Sprintf("db.t.%d", i), Data: []byte(fmt.Sprint(i)), ID: fmt.Sprint("id-", i)})
	}
	cursors, err := b.Publish(context.Background(), out)
	if err != nil {
		t.Fatal(err)
	}
	for i, cur := range cursors {
		if want := broker.FormatJSCursor(uint64(i + 2)); cur != want {
			t.Fatalf("cursor %d = %q, want %q", i, cur, want)
		}
	}
	got := c.waitFor(t, 300)
	for i, m := range got {
		if string(m.Data) != fmt.Sprint(i) || m.Cursor != cursors[i] {
			t.Fatalf("message %d: %q cursor %q, want %d %q", i, m.Data, m.Cursor, i, cursors[i])
		}
	}
	// A repeated id is deduplicated: acked with the original sequence, not delivered again.
	again, err := b.Publish(context.Background(), out[:1])
	if err != nil {
		t.Fatal(err)
	}
	if again[0] != cursors[0] {
		t.Fatalf("republished id got cursor %q, want the original %q", again[0], cursors[0])
	}
	sentinel, err := b.Publish(context.Background(), []broker.Outgoing{{Subject: "app.end", Data: []byte(`"end"`)}})
	if err != nil {
		t.Fatal(err)
	}
	got = c.waitFor(t, 301)
	if len(got) != 301 || got[300].Cursor != sentinel[0] {
		t.Fatalf("after the duplicate: %d messages, last %q; want 301 ending with the sentinel %q", len(got), got[len(got)-1].Cursor, sentinel[0])
	}
}

func TestJetStreamStreamSettings(t *testing.T) {
	t.Parallel()
	ns := brokertest.NATS(t)
	url := ns.ClientURL()
	dialJS(t, broker.JetStreamConfig{NATSConfig: broker.NATSConfig{URL: url, Subjects: []string{"a.>"}}, Stream: "S", MaxAge: time.Hour})
	// Changeable settings are updated in place.
	dialJS(t, broker.JetStreamConfig{NATSConfig: broker.NATSConfig{URL: url, Subjects: []string{"a.>", "b.>"}}, Stream: "S", MaxAge: 2 * time.Hour})
	// Storage cannot change: a clear error naming it.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := broker.DialJetStream(ctx, broker.JetStreamConfig{NATSConfig: broker.NATSConfig{URL: url, Subjects: []string{"a.>"}}, Stream: "S", Storage: "memory"})
	if err == nil || !strings.Contains(err.Error(), "storage") {
		t.Fatalf("storage change: %v, want an error naming storage", err)
	}
	_, err = broker.DialJetStream(ctx, broker.JetStreamConfig{NATSConfig: broker.NATSConfig{URL: url, Subjects: []string{"a.>"}}, Storage: "disk"})
	if err == nil || !strings.Contains(err.Error(), "disk") {
		t.Fatalf("bad storage: %v", err)
	}
	_, err = broker.DialJetStream(ctx, broker.JetStreamConfig{NATSConfig: broker.NATSConfig{URL: url}})
	if err == nil || !strings.Contains(err.Error(), "--subjects") {
		t.Fatalf("stream on every subject: %v, want an error pointing at --subjects", err)
	}
}

func TestParseJSCursor(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in   string
		want uint64
		ok   bool
	}{
		{"js:1", 1, true}, {"js:18446744073709551615", 1<<64 - 1, true},
		{"js:0", 0, false}, {"js:", 0, false}, {"js:01", 0, false}, {"js:-1", 0, false},
		{"js:1x", 0, false}, {"rs:1-0", 0, false}, {"1", 0, false}, {"", 0, false},
		{"js:18446744073709551616", 0, false},
	} {
		got, err := broker.ParseJSCursor(tc.in)
		if tc.ok && (err != nil || got != tc.want) {
			t.Errorf("ParseJSCursor(%q) = %d, %v; want %d", tc.in, got, err, tc.want)
		}
		if !tc.ok && !errors.Is(err, broker.ErrBadCursor) {
			t.Errorf("ParseJSCursor(%q) = %d, %v; want ErrBadCursor", tc.in, got, err)
		}
		if tc.ok && broker.FormatJSCursor(got) != tc.in {
			t.Errorf("FormatJSCursor(%d) != %q", got, tc.in)
		}
	}
}

func TestJetStreamReplay(t *testing.T) {
	t.Parallel()
	ns := brokertest.NATS(t)
	b := dialJS(t, broker.JetStreamConfig{NATSConfig: broker.NATSConfig{URL: ns.ClientURL(), Subjects: []string{"db.>"}}, Stream: "R"})
	var out []broker.Outgoing
	for i := 1; i <= 100; i++ {
		out = append(out, broker.Outgoing{Subject: fmt.Sprintf("db.%s.%d", []string{"a", "b"}[i%2], i), Data: []byte(fmt.Sprint(i))})
	}
	if _, err := b.Publish(context.Background(), out); err != nil {
		t.Fatal(err)
	}
	replay := func(filter, after, until string) ([]string, error) {
		var got []string
		err := b.Replay(context.Background(), []string{filter}, after, until, func(ms []broker.Message) error {
			for _, m := range ms {
				got = append(got, m.Cursor)
			}
			return nil
		})
		return got, err
	}
	got, err := replay("db.a.>", "js:10", "js:60")
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for i := 12; i <= 60; i += 2 {
		want = append(want, broker.FormatJSCursor(uint64(i)))
	}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("replay db.a.> (js:10, js:60]:\n got %v\nwant %v", got, want)
	}
	if got, err = replay("db.>", "", "js:3"); err != nil || strings.Join(got, ",") != "js:1,js:2,js:3" {
		t.Fatalf("replay from the first: %v %v", got, err)
	}
	if got, err = replay("db.>", "js:100", "js:100"); err != nil || len(got) != 0 {
		t.Fatalf("replay of nothing: %v %v", got, err)
	}
	if _, err = replay("db.>", "js:101", "js:200"); !errors.Is(err, broker.ErrBadCursor) {
		t.Fatalf("cursor ahead of the stream: %v, want ErrBadCursor", err)
	}
	if _, err = replay("db.>", "rs:1-0", "js:2"); !errors.Is(err, broker.ErrBadCursor) {
		t.Fatalf("cursor of another broker: %v, want ErrBadCursor", err)
	}
	// The live feed reports where it starts.
	started := make(chan string, 1)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- b.Consume(ctx, func([]broker.Message, time.Time) {}, func(s string) { started <- s })
	}()
	if s := <-started; s != "js:100" {
		t.Errorf("live feed starts after %q, want js:100", s)
	}
	cancel()
	<-done
}

// TestJetStreamReplayEndsWithoutMatches replays a range in which nothing
// after the cursor matches the filter: the replay ends at once, and still
// ends once a matching message lies only beyond the range.
func TestJetStreamReplayEndsWithoutMatches(t *testing.T) {
	t.Parallel()
	ns := brokertest.NATS(t)
	b := dialJS(t, broker.JetStreamConfig{NATSConfig: broker.NATSConfig{URL: ns.ClientURL(), Subjects: []string{"db.>"}}, Stream: "M"})
	out := []broker.Outgoing{{Subject: "db.a.1", Data: []byte(`1`)}}
	for i := 2; i <= 5; i++ {
		out = append(out, broker.Outgoing{Subject: fmt.Sprintf("db.b.%d", i), Data: []byte(fmt.Sprint(i))})
	}
	if _, err := b.Publish(t.Context(), out); err != nil {
		t.Fatal(err)
	}
	replay := func() ([]string, error) {
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		var got []string
		err := b.Replay(ctx, []string{"db.a.>"}, "js:1", "js:5", func(ms []broker.Message) error {
			for _, m := range ms {
				got = append(got, m.Cursor)
			}
			return nil
		})
		return got, err
	}
	if got, err := replay(); err != nil || len(got) != 0 {
		t.Fatalf("replay db.a.> (js:1, js:5] with no match after js:1: %v %v, want nothing and no error", got, err)
	}
	if _, err := b.Publish(t.Context(), []broker.Outgoing{{Subject: "db.a.6", Data: []byte(`6`)}}); err != nil {
		t.Fatal(err)
	}
	if got, err := replay(); err != nil || len(got) != 0 {
		t.Fatalf("replay db.a.> (js:1, js:5] with a match at js:6: %v %v, want nothing and no error", got, err)
	}
}

// TestJetStreamReplaySurvivesASlowFetch holds the server's answer to the
// replay's first fetch for 1.5 s on the way to the client. nats.go ends a
// no-wait fetch after 1 s without an answer, with no messages and no
// error; the replay must fetch again, not take that for the end of the
// range (which skipped the range's events for a resuming client).
func TestJetStreamReplaySurvivesASlowFetch(t *testing.T) {
	t.Parallel()
	ns := brokertest.NATS(t)
	p := startStallingProxy(t, ns.Addr().String(), 1500*time.Millisecond)
	b := dialJS(t, broker.JetStreamConfig{NATSConfig: broker.NATSConfig{URL: "nats://" + p.Addr(), Subjects: []string{"db.>"}}, Stream: "S"})
	var out []broker.Outgoing
	for i := 1; i <= 10; i++ {
		out = append(out, broker.Outgoing{Subject: "db.a", Data: []byte(fmt.Sprint(i))})
	}
	cursors, err := b.Publish(t.Context(), out)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	var got []string
	err = b.Replay(ctx, []string{"db.>"}, "", cursors[9], func(ms []broker.Message) error {
		for _, m := range ms {
			got = append(got, m.Cursor)
		}
		return nil
	})
	if err != nil || !slices.Equal(got, cursors) {
		t.Fatalf("replay (start, %s] through a stalled fetch: %v %v, want %v", cursors[9], got, err, cursors)
	}
	if !p.held.Load() {
		t.Fatal("the proxy never held a fetch's answer: the test did not test the stall")
	}
}

// stallingProxy forwards TCP to a NATS server and holds the first chunk
// from the server that carries a JetStream message (its reply subject
// starts with $JS.ACK.) for a while before passing it on.
type stallingProxy struct {
	*brokertest.Proxy
	held atomic.Bool // a chunk was held
}

func startStallingProxy(t *testing.T, server string, hold time.Duration) *stallingProxy {
	t.Helper()
	marker := []byte("$JS.ACK.")
	p := &stallingProxy{}
	p.Proxy = brokertest.StartProxy(t, server, brokertest.ProxyConfig{FromServer: func(ctx context.Context, dst io.Writer, src io.Reader) {
		buf := make([]byte, 64<<10)
		var tail []byte // the end of the last chunk, for a marker split across two
		for {
			n, err := src.Read(buf)
			if n > 0 {
				chunk := buf[:n]
				joined := append(slices.Clone(tail), chunk...)
				if bytes.Contains(joined, marker) && p.held.CompareAndSwap(false, true) {
					select {
					case <-time.After(hold):
					case <-ctx.Done():
						return
					}
				}
				tail = joined[max(0, len(joined)-len(marker)):]
				if _, err := dst.Write(chunk); err != nil {
					return
				}
			}
			if err != nil {
				return
			}
		}
	}})
	return p
}

func TestJetStreamReplayExpiredCursor(t *testing.T) {
	t.Parallel()
	ns := brokertest.NATS(t)
	b := dialJS(t, broker.JetStreamConfig{NATSConfig: broker.NATSConfig{URL: ns.ClientURL(), Subjects: []string{"x.>"}}, Stream: "E", MaxBytes: 4096})
	for i := range 100 {
		if _, err := b.Publish(context.Background(), []broker.Outgoing{{Subject: "x.y", Data: []byte(fmt.Sprintf(`{"i":%d,"pad":"%s"}`, i, strings.Repeat("p", 100)))}}); err != nil {
			t.Fatal(err)
		}
	}
	err := b.Replay(context.Background(), []string{"x.>"}, "js:1", "js:100", func([]broker.Message) error { return nil })
	if !errors.Is(err, broker.ErrCursorExpired) {
		t.Fatalf("replay from a trimmed cursor: %v, want ErrCursorExpired", err)
	}
}

// TestJetStreamDeletedStreamIsRecreated deletes the stream under a live
// feed (as an operator might, or as a restart does to a memory stream):
// the broker re-creates it, numbered on after the last event delivered, and
// the feed goes on.
func TestJetStreamDeletedStreamIsRecreated(t *testing.T) {
	t.Parallel()
	ns := brokertest.NATS(t)
	b := dialJS(t, broker.JetStreamConfig{NATSConfig: broker.NATSConfig{URL: ns.ClientURL(), Subjects: []string{"d.>"}}, Stream: "D", Storage: "memory"})
	c := consume(t, b)
	publish := func(from, to int) {
		t.Helper()
		var out []broker.Outgoing
		for i := from; i <= to; i++ {
			out = append(out, broker.Outgoing{Subject: "d.x", Data: []byte(fmt.Sprint(i))})
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := b.Publish(ctx, out); err != nil {
			t.Fatal(err)
		}
	}
	publish(1, 3)
	c.waitFor(t, 3)
	js := brokertest.JetStream(t, ns.ClientURL())
	if err := js.DeleteStream(context.Background(), "D"); err != nil {
		t.Fatal(err)
	}
	publish(4, 6) // answered "no responders" until the stream is back
	got := c.waitFor(t, 6)
	for i, m := range got {
		if string(m.Data) != fmt.Sprint(i+1) || m.Cursor != broker.FormatJSCursor(uint64(i+1)) {
			t.Fatalf("message %d: %q %q, want %d js:%d", i, m.Data, m.Cursor, i+1, i+1)
		}
	}
	s, err := js.Stream(context.Background(), "D")
	if err != nil {
		t.Fatal(err)
	}
	if cfg := s.CachedInfo().Config; cfg.Storage != jetstream.MemoryStorage || !slices.Equal(cfg.Subjects, []string{"d.>"}) {
		t.Errorf("re-created with storage %v, subjects %v; want the configured memory, [d.>]", cfg.Storage, cfg.Subjects)
	}
}

// TestJetStreamReplicasOnCluster: on a NATS cluster, a stream an operator
// made with 3 replicas keeps them when the broker is not told a count (it
// used to shrink it to 1), and a new stream gets 1 unless told otherwise.
func TestJetStreamReplicasOnCluster(t *testing.T) {
	t.Parallel()
	nodes := brokertest.NATSCluster(t, 3)
	url := nodes[0].ClientURL()
	js := brokertest.JetStream(t, url)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "OPS", Subjects: []string{"o.>"}, Replicas: 3}); err != nil {
		t.Fatal(err)
	}
	replicas := func(name string) int {
		t.Helper()
		s, err := js.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		return s.CachedInfo().Config.Replicas
	}
	dialJS(t, broker.JetStreamConfig{NATSConfig: broker.NATSConfig{URL: url, Subjects: []string{"o.>"}}, Stream: "OPS", MaxAge: time.Hour})
	if n := replicas("OPS"); n != 3 {
		t.Errorf("the operator's stream has %d replicas after the broker updated it, want 3", n)
	}
	dialJS(t, broker.JetStreamConfig{NATSConfig: broker.NATSConfig{URL: url, Subjects: []string{"n.>"}}, Stream: "NEW"})
	if n := replicas("NEW"); n != 1 {
		t.Errorf("a new stream has %d replicas, want 1", n)
	}
}

// TestJetStreamGapsAreCounted: events removed by retention before the live
// feed read them (its handler was stuck) are reported to OnGap, so that
// every published event is either delivered or counted.
func TestJetStreamGapsAreCounted(t *testing.T) {
	t.Parallel()
	ns := brokertest.NATS(t)
	var gaps atomic.Int64
	b := dialJS(t, broker.JetStreamConfig{
		NATSConfig: broker.NATSConfig{URL: ns.ClientURL(), Subjects: []string{"x.>"}},
		Stream:     "G", MaxBytes: 64 << 10,
		OnGap: func(n int) { gaps.Add(int64(n)) },
	})
	broker.SetFeedBuffer(b, 16)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	release := make(chan struct{})
	started := make(chan string, 1)
	var delivered atomic.Int64
	done := make(chan error, 1)
	go func() {
		done <- b.Consume(ctx, func(ms []broker.Message, _ time.Time) {
			<-release // stuck until every event is published
			delivered.Add(int64(len(ms)))
		}, func(s string) { started <- s })
	}()
	<-started
	const n = 5000
	data := []byte(`{"pad":"` + strings.Repeat("p", 200) + `"}`)
	for i := 0; i < n; i += 500 {
		var out []broker.Outgoing
		for range 500 {
			out = append(out, broker.Outgoing{Subject: "x.y", Data: data})
		}
		if _, err := b.Publish(context.Background(), out); err != nil {
			t.Fatal(err)
		}
	}
	close(release)
	deadline := time.Now().Add(10 * time.Second)
	for delivered.Load()+gaps.Load() < n && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if d, g := delivered.Load(), gaps.Load(); d+g != n || g == 0 {
		t.Fatalf("%d delivered + %d counted as gaps, want %d in all with some gaps (64 KiB retention)", d, g, n)
	}
	cancel()
	<-done
}

// TestJetStreamDuplicatesIsAFloor: the configured duplicate window raises
// a shorter one and never lowers the longer one an operator set.
func TestJetStreamDuplicatesIsAFloor(t *testing.T) {
	t.Parallel()
	ns := brokertest.NATS(t)
	url := ns.ClientURL()
	js := brokertest.JetStream(t, url)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "DUP", Subjects: []string{"d.>"}, Duplicates: 10 * time.Minute}); err != nil {
		t.Fatal(err)
	}
	window := func() time.Duration {
		t.Helper()
		s, err := js.Stream(ctx, "DUP")
		if err != nil {
			t.Fatal(err)
		}
		return s.CachedInfo().Config.Duplicates
	}
	cfg := broker.JetStreamConfig{NATSConfig: broker.NATSConfig{URL: url, Subjects: []string{"d.>"}}, Stream: "DUP"}
	dialJS(t, cfg) // the default, 2 minutes
	if w := window(); w != 10*time.Minute {
		t.Errorf("the operator's 10m window is %v after a broker with the default dialled, want 10m", w)
	}
	cfg.MaxAge = 5 * time.Minute
	dialJS(t, cfg)
	if w := window(); w != 5*time.Minute {
		t.Errorf("window %v with MaxAge 5m, want 5m (the server keeps it within MaxAge)", w)
	}
	cfg.MaxAge, cfg.Duplicates = 0, 20*time.Minute
	dialJS(t, cfg)
	if w := window(); w != 20*time.Minute {
		t.Errorf("window %v after a broker asking for 20m, want 20m", w)
	}
}
