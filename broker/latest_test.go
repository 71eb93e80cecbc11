package broker_test

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/fanwire/fanwire/broker"
	"github.com/fanwire/fanwire/broker/brokertest"
	"github.com/fanwire/fanwire/subject"
)

var (
	_ broker.Snapshots = (*broker.JetStream)(nil)
	_ broker.Snapshots = (*broker.Redis)(nil)
)

// snapshotter is a broker a live view can start from.
type snapshotter interface {
	broker.Durable
	broker.Appender
	broker.Snapshots
}

// snapshotTarget is a broker kind to run a Latest test on: open gives a
// broker on an empty stream of its own whose subject space is db.> and
// app.>; hooks sets the broker's test hooks into Latest (afterScan only
// where Latest has that step).
type snapshotTarget struct {
	open  func() snapshotter
	hooks func(b snapshotter, afterThrough, afterScan func())
	// scanned, where Latest reads an index in pages (Redis Streams), sets
	// a hook told how many entries Latest holds after each page.
	scanned func(b snapshotter, held func(int))
}

// onSnapshots runs test on JetStream (an embedded server per stream) and
// on a redis-server (TestRedisLatestOnCluster runs the Redis tests on a
// Redis Cluster).
func onSnapshots(t *testing.T, test func(t *testing.T, tg snapshotTarget)) {
	t.Run("jetstream", func(t *testing.T) {
		test(t, snapshotTarget{
			open: func() snapshotter {
				ns := brokertest.NATS(t)
				return dialJS(t, broker.JetStreamConfig{NATSConfig: broker.NATSConfig{URL: ns.ClientURL(), Subjects: []string{"db.>", "app.>"}}, Stream: "L"})
			},
			hooks: func(b snapshotter, afterThrough, _ func()) {
				broker.SetLatestHooks(b.(*broker.JetStream), afterThrough)
			},
		})
	})
	t.Run("redis", func(t *testing.T) { test(t, onRedisStreams(t, redisSingle(t))) })
}

// onRedisStreams opens each broker of a test on a stream of its own on r,
// named after the test (tests may share r).
func onRedisStreams(t *testing.T, r redisTarget) snapshotTarget {
	n := 0
	return snapshotTarget{
		open: func() snapshotter {
			n++
			return dialRedis(t, r.with(broker.RedisConfig{Stream: fmt.Sprintf("{%s-%d}", t.Name(), n)}))
		},
		hooks: func(b snapshotter, afterThrough, afterScan func()) {
			broker.SetRedisLatestHooks(b.(*broker.Redis), afterThrough, afterScan)
		},
		scanned: func(b snapshotter, held func(int)) { broker.SetRedisLatestScanned(b.(*broker.Redis), held) },
	}
}

// latestOf runs Latest and returns what it delivered, the size of each
// batch, and through.
func latestOf(t *testing.T, b broker.Snapshots, filters []string) (msgs []broker.Message, batches []int, through string) {
	t.Helper()
	through, err := b.Latest(t.Context(), filters, 0, func(ms []broker.Message) error {
		msgs = append(msgs, ms...)
		batches = append(batches, len(ms))
		return nil
	})
	if err != nil {
		t.Fatalf("Latest(%q): %v", filters, err)
	}
	return msgs, batches, through
}

// replayAll is every message stored up to until ("": none).
func replayAll(t *testing.T, b broker.Durable, after, until string) []broker.Message {
	t.Helper()
	if until == "" {
		return nil
	}
	var got []broker.Message
	if err := b.Replay(t.Context(), nil, after, until, func(ms []broker.Message) error {
		got = append(got, ms...)
		return nil
	}); err != nil {
		t.Fatalf("replay (%q, %q]: %v", after, until, err)
	}
	return got
}

// newest is each subject's last message of msgs.
func newest(msgs []broker.Message) map[string]broker.Message {
	m := make(map[string]broker.Message)
	for _, x := range msgs {
		m[x.Subject] = x
	}
	return m
}

// checkCursorOrder fails unless msgs are in strictly increasing cursor
// order (so none twice), none after through.
func checkCursorOrder(t *testing.T, b broker.Durable, msgs []broker.Message, through string) {
	t.Helper()
	for i, m := range msgs {
		if c, err := b.CompareCursors(m.Cursor, through); err != nil || c > 0 {
			t.Fatalf("message %d (%s %s) is after through %s (%v)", i, m.Subject, m.Cursor, through, err)
		}
		if i == 0 {
			continue
		}
		if c, err := b.CompareCursors(msgs[i-1].Cursor, m.Cursor); err != nil || c >= 0 {
			t.Fatalf("message %d: %s after %s: not in cursor order (%v)", i, m.Cursor, msgs[i-1].Cursor, err)
		}
	}
}

func publish(t *testing.T, b broker.Broker, out []broker.Outgoing) []string {
	t.Helper()
	cursors, err := b.Publish(t.Context(), out)
	if err != nil {
		t.Fatal(err)
	}
	return cursors
}

func appendAs(t *testing.T, b broker.Appender, writer string, out []broker.Outgoing) {
	t.Helper()
	if err := b.Append(t.Context(), out, broker.AppendOptions{Writer: writer}); err != nil {
		t.Fatal(err)
	}
}

// TestLatestNewestOfEachSubject: 300 subjects with two or three versions
// each, published with and without ids and appended as the ingest does:
// Latest delivers exactly the newest of each, in cursor order, in batches
// of at most 256, a delete like any other; and an error from the handler
// ends it.
func TestLatestNewestOfEachSubject(t *testing.T) { onSnapshots(t, testLatestNewestOfEachSubject) }

func testLatestNewestOfEachSubject(t *testing.T, tg snapshotTarget) {
	b := tg.open()
	const n = 300
	want := make(map[string]string)
	var v1, v2, v3 []broker.Outgoing
	for k := range n {
		subj := fmt.Sprintf("db.t.%d", k)
		v1 = append(v1, broker.Outgoing{Subject: subj, Data: fmt.Appendf(nil, `{"v":1,"k":%d}`, k)})
		v2 = append(v2, broker.Outgoing{Subject: subj, Data: fmt.Appendf(nil, `{"v":2,"k":%d}`, k), ID: fmt.Sprint("p-", k)})
		want[subj] = string(v2[k].Data)
		if k%2 == 0 {
			v3 = append(v3, broker.Outgoing{Subject: subj, Data: fmt.Appendf(nil, `{"v":3,"k":%d}`, k), ID: broker.WriterID("w", fmt.Sprint(k))})
			want[subj] = string(v3[len(v3)-1].Data)
		}
	}
	slices.Reverse(v2)
	publish(t, b, v1)
	publish(t, b, v2)
	appendAs(t, b, "w", v3)
	del := broker.Outgoing{Subject: "db.t.7", Data: []byte(`{"op":"delete","doc":null}`), ID: broker.WriterID("w", "del-7")}
	appendAs(t, b, "w", []broker.Outgoing{del})
	want[del.Subject] = string(del.Data)
	last := publish(t, b, []broker.Outgoing{{Subject: "app.x", Data: []byte(`"x"`)}})[0]
	want["app.x"] = `"x"`

	msgs, batches, through := latestOf(t, b, nil)
	if through != last {
		t.Fatalf("through = %q, want the last cursor %q", through, last)
	}
	checkCursorOrder(t, b, msgs, through)
	full := newest(replayAll(t, b, "", through))
	for _, m := range msgs {
		if w, ok := want[m.Subject]; !ok || string(m.Data) != w {
			t.Fatalf("%s: %s, want %s", m.Subject, m.Data, w)
		}
		if m.Cursor != full[m.Subject].Cursor {
			t.Fatalf("%s: cursor %s, but its newest is at %s", m.Subject, m.Cursor, full[m.Subject].Cursor)
		}
	}
	if len(msgs) != len(want) {
		t.Fatalf("Latest delivered %d messages, want one per subject: %d", len(msgs), len(want))
	}
	if len(batches) < 2 || slices.Max(batches) > 256 {
		t.Fatalf("batches of %v: want several, none over 256", batches)
	}

	stop := errors.New("enough")
	calls := 0
	_, err := b.Latest(t.Context(), nil, 0, func([]broker.Message) error { calls++; return stop })
	if !errors.Is(err, stop) || calls != 1 {
		t.Fatalf("a handler failing at once: %d calls, Latest returned %v; want 1 call and its error", calls, err)
	}
}

// TestLatestLimit: with a limit, a snapshot of more subjects on its
// filters than the limit is refused with ErrSnapshotTooLarge, delivering
// none of them (both brokers know the count before the first message);
// one of exactly the limit is delivered whole, and subjects off the
// filters do not count. Redis Streams holds at most the limit and a page
// of the index while it counts (before: the whole index, sorted, and
// every subject delivered).
func TestLatestLimit(t *testing.T) { onSnapshots(t, testLatestLimit) }

func testLatestLimit(t *testing.T, tg snapshotTarget) {
	b := tg.open()
	const n = 5000
	var out []broker.Outgoing
	for k := range n {
		out = append(out, broker.Outgoing{Subject: fmt.Sprintf("db.t.%d", k), Data: fmt.Appendf(nil, "%d", k), ID: broker.WriterID("w", fmt.Sprint(k))})
	}
	for k := range 20 {
		out = append(out, broker.Outgoing{Subject: fmt.Sprintf("app.x.%d", k), Data: []byte(`"x"`), ID: broker.WriterID("w", fmt.Sprint("x", k))})
	}
	appendAs(t, b, "w", out)
	held := 0
	if tg.scanned != nil {
		tg.scanned(b, func(h int) { held = max(held, h) })
	}
	for _, tc := range []struct {
		filters []string
		limit   int
		want    int // messages delivered; -1: refused
	}{
		{[]string{"db.t.*"}, n, n},
		{[]string{"db.t.*"}, 0, n},
		{[]string{"db.t.*"}, n - 1, -1},
		{[]string{"db.t.*"}, 1000, -1},
		{[]string{"app.x.*"}, 20, 20},
		{nil, n + 20, n + 20},
		{nil, n + 19, -1},
	} {
		held = 0
		got := 0
		_, err := b.Latest(t.Context(), tc.filters, tc.limit, func(ms []broker.Message) error {
			got += len(ms)
			return nil
		})
		switch {
		case tc.want >= 0 && (err != nil || got != tc.want):
			t.Errorf("Latest(%q, limit %d): %d delivered, %v; want %d", tc.filters, tc.limit, got, err, tc.want)
		case tc.want < 0 && (!errors.Is(err, broker.ErrSnapshotTooLarge) || got != 0):
			t.Errorf("Latest(%q, limit %d): %d delivered, %v; want none and ErrSnapshotTooLarge", tc.filters, tc.limit, got, err)
		}
		// HSCAN's COUNT (1,000) is a hint: a page may hold a few more.
		if tg.scanned != nil && tc.want < 0 && held > tc.limit+1500 {
			t.Errorf("Latest(%q, limit %d) held %d entries of the index, want at most the limit and a page", tc.filters, tc.limit, held)
		}
	}
}

// TestLatestFilters: Latest delivers only the subjects on its filters
// (both brokers filter exactly, though callers must not count on it);
// none means every subject.
func TestLatestFilters(t *testing.T) { onSnapshots(t, testLatestFilters) }

func testLatestFilters(t *testing.T, tg snapshotTarget) {
	b := tg.open()
	var out []broker.Outgoing
	for _, s := range []string{"db.orders.1", "db.orders.2", "db.users.1", "db.orders.1", "db.orders.1.x", "app.x", "app.y.z", "db.users.2"} {
		out = append(out, broker.Outgoing{Subject: s, Data: []byte(`{}`)})
	}
	last := publish(t, b, out)[len(out)-1]
	for _, tc := range []struct {
		filters []string
		want    string
	}{
		{nil, "db.orders.2 db.users.1 db.orders.1 db.orders.1.x app.x app.y.z db.users.2"},
		{[]string{"db.orders.*"}, "db.orders.2 db.orders.1"},
		{[]string{"db.orders.*", "app.>"}, "db.orders.2 db.orders.1 app.x app.y.z"},
		{[]string{"db.*.1"}, "db.users.1 db.orders.1"},
		{[]string{"db.users.2"}, "db.users.2"},
		{[]string{"db.none.*"}, ""},
	} {
		msgs, _, through := latestOf(t, b, tc.filters)
		var got []string
		for _, m := range msgs {
			got = append(got, m.Subject)
		}
		if strings.Join(got, " ") != tc.want || through != last {
			t.Errorf("Latest(%q): %q through %s, want %q through %s", tc.filters, got, through, tc.want, last)
		}
	}
}

// TestLatestEmptyStream: on a stream that holds nothing Latest returns ""
// without calling the handler.
func TestLatestEmptyStream(t *testing.T) { onSnapshots(t, testLatestEmptyStream) }

func testLatestEmptyStream(t *testing.T, tg snapshotTarget) {
	b := tg.open()
	through, err := b.Latest(t.Context(), []string{"db.>"}, 0, func(ms []broker.Message) error {
		t.Errorf("handler called with %d messages on an empty stream", len(ms))
		return nil
	})
	if err != nil || through != "" {
		t.Fatalf("Latest on an empty stream: through %q, %v; want \"\"", through, err)
	}
}

// TestLatestWhilePublishing publishes while Latest runs: at each of its
// steps (from the hooks and its handler, so the race is certain) and from
// a publisher running throughout. The contract holds: in cursor order,
// nothing after through, each subject's newest at or before through or
// (when it has a newer one) nothing; and Latest followed by Replay(through,
// end] leaves each subject at the same message as a full replay.
func TestLatestWhilePublishing(t *testing.T) { onSnapshots(t, testLatestWhilePublishing) }

func testLatestWhilePublishing(t *testing.T, tg snapshotTarget) {
	b := tg.open()
	const n = 400
	var out []broker.Outgoing
	for k := range n {
		out = append(out, broker.Outgoing{Subject: fmt.Sprintf("db.t.%d", k), Data: fmt.Appendf(nil, `"a%d"`, k), ID: broker.WriterID("w", fmt.Sprint(k))})
	}
	appendAs(t, b, "w", out)
	out = out[:0]
	for k := 0; k < n; k += 2 {
		out = append(out, broker.Outgoing{Subject: fmt.Sprintf("db.t.%d", k), Data: fmt.Appendf(nil, `"b%d"`, k)})
	}
	publish(t, b, out)
	// The last message before Latest is on a subject the first injection
	// updates: at through, the newest of that subject is after through.
	publish(t, b, []broker.Outgoing{{Subject: "db.t.1", Data: []byte(`"c1"`)}})

	// Each injection updates 40 subjects and adds 5.
	inject := func(step string, from int) func() {
		return func() {
			var out []broker.Outgoing
			for k := from; k < from+40; k++ {
				out = append(out, broker.Outgoing{Subject: fmt.Sprintf("db.t.%d", k), Data: fmt.Appendf(nil, `"%s%d"`, step, k)})
			}
			for k := range 5 {
				out = append(out, broker.Outgoing{Subject: fmt.Sprintf("db.new.%s%d", step, k), Data: []byte(`"new"`)})
			}
			publish(t, b, out)
		}
	}
	tg.hooks(b, inject("through", 0), inject("scan", 100))
	handled := inject("handler", n-40)

	stop := make(chan struct{})
	bgErr := make(chan error, 1)
	var bg sync.WaitGroup
	bg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			var out []broker.Outgoing
			for j := range 10 {
				out = append(out, broker.Outgoing{Subject: fmt.Sprintf("db.t.%d", (i*37+j*11)%(n+20)), Data: fmt.Appendf(nil, `"bg%d-%d"`, i, j)})
			}
			if _, err := b.Publish(t.Context(), out); err != nil {
				bgErr <- err
				return
			}
		}
	})
	var msgs []broker.Message
	calls := 0
	through, err := b.Latest(t.Context(), nil, 0, func(ms []broker.Message) error {
		if calls++; calls == 1 {
			handled()
		}
		msgs = append(msgs, ms...)
		return nil
	})
	close(stop)
	bg.Wait()
	select {
	case err := <-bgErr:
		t.Fatalf("background publisher: %v", err)
	default:
	}
	if err != nil {
		t.Fatal(err)
	}
	end := publish(t, b, []broker.Outgoing{{Subject: "app.end", Data: []byte(`"end"`)}})[0]

	checkCursorOrder(t, b, msgs, through)
	full := replayAll(t, b, "", end)
	var upTo []broker.Message // what was stored at or before through
	for _, m := range full {
		if c, _ := b.CompareCursors(m.Cursor, through); c <= 0 {
			upTo = append(upTo, m)
		}
	}
	asOf, final := newest(upTo), newest(full)
	delivered := make(map[string]bool)
	stale := 0 // subjects delivered at through's version, newer since
	for _, m := range msgs {
		if w := asOf[m.Subject]; m.Cursor != w.Cursor || string(m.Data) != string(w.Data) {
			t.Fatalf("%s: delivered %s %s, but its newest at or before through %s is %s %s", m.Subject, m.Cursor, m.Data, through, w.Cursor, w.Data)
		}
		delivered[m.Subject] = true
		if final[m.Subject].Cursor != m.Cursor {
			stale++
		}
	}
	leftOut := 0
	for subj, w := range asOf {
		if delivered[subj] {
			continue
		}
		if final[subj].Cursor == w.Cursor {
			t.Fatalf("%s: left out, but its newest (%s) is at or before through %s", subj, w.Cursor, through)
		}
		leftOut++
	}
	if leftOut == 0 || stale == 0 {
		t.Fatalf("%d subjects left out, %d delivered and updated since: the test did not race Latest with publishers", leftOut, stale)
	}
	view := newest(append(msgs, replayAll(t, b, through, end)...))
	if len(view) != len(final) {
		t.Fatalf("Latest then Replay(through, end] give %d subjects, a full replay %d", len(view), len(final))
	}
	for subj, w := range final {
		if view[subj].Cursor != w.Cursor {
			t.Fatalf("%s: Latest then Replay(through, end] end at %s, a full replay at %s", subj, view[subj].Cursor, w.Cursor)
		}
	}
	t.Logf("through %s: %d delivered in %d calls, %d of them updated since, %d subjects left out; %d stored by the end", through, len(msgs), calls, stale, leftOut, len(full))
}

// TestJetStreamLatestOnDebianNATS29: NATS 2.9 takes one filter subject per
// consumer, and a last-per-subject consumer needs one: several patterns,
// or none on a stream with several subjects, read the whole stream (the
// caller matches), one pattern only its own.
func TestJetStreamLatestOnDebianNATS29(t *testing.T) {
	t.Parallel()
	url := brokertest.NATSBinary(t, brokertest.DebianNATS)
	b := dialJS(t, broker.JetStreamConfig{NATSConfig: broker.NATSConfig{URL: url, Subjects: []string{"app.>", "db.>"}}})
	var out []broker.Outgoing
	for _, s := range []string{"db.a.1", "app.x", "db.b.1", "db.a.1", "app.x", "db.a.2"} {
		out = append(out, broker.Outgoing{Subject: s, Data: []byte(`{}`)})
	}
	last := publish(t, b, out)[len(out)-1]
	for _, tc := range []struct {
		filters []string
		want    string // after matching, as callers do
		all     bool   // whether every subject is delivered
	}{
		{nil, "db.b.1 db.a.1 app.x db.a.2", true},
		{[]string{"db.a.*", "app.>"}, "db.a.1 app.x db.a.2", true},
		{[]string{"db.a.*"}, "db.a.1 db.a.2", false},
	} {
		msgs, _, through := latestOf(t, b, tc.filters)
		checkCursorOrder(t, b, msgs, through)
		var got []string
		for _, m := range msgs {
			if len(tc.filters) == 0 || slices.ContainsFunc(tc.filters, func(f string) bool { return subject.Match(f, m.Subject) }) {
				got = append(got, m.Subject)
			}
		}
		if strings.Join(got, " ") != tc.want || through != last || (len(msgs) == 4) != tc.all {
			t.Errorf("Latest(%q): %d delivered, %q after matching, through %s; want %q through %s", tc.filters, len(msgs), got, through, tc.want, last)
		}
	}
	// Reading the whole stream, a limit counts the subjects on filters
	// only: 3 here, beside db.b.1.
	filters := []string{"db.a.*", "app.>"}
	for _, limit := range []int{3, 2} {
		n := 0
		_, err := b.Latest(t.Context(), filters, limit, func(ms []broker.Message) error { n += len(ms); return nil })
		if limit == 3 && (err != nil || n != 4) || limit == 2 && (!errors.Is(err, broker.ErrSnapshotTooLarge) || n > 2) {
			t.Errorf("Latest(%q, limit %d): %d delivered, %v", filters, limit, n, err)
		}
	}
}
