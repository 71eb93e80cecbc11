package broker_test

import (
	"errors"
	"fmt"
	"maps"
	"strings"
	"testing"

	"github.com/fanwire/fanwire/broker"
)

// redisIndex is the index Latest reads, as the server holds it: subject →
// cursor of its newest entry.
func redisIndex(t *testing.T, r redisTarget, stream string) map[string]string {
	t.Helper()
	h, err := r.raw.HGetAll(t.Context(), stream+":latest").Result()
	if err != nil {
		t.Fatal(err)
	}
	for s, id := range h {
		h[s] = broker.CursorPrefixRedis + id
	}
	return h
}

// TestRedisLatestIndex: both write paths keep the index of each subject's
// newest entry in the step that appends: Publish (with and without ids)
// and Append (the ingest's); a repeat dropped as a duplicate, or a call
// refused as a conflict, leaves it as it was.
func TestRedisLatestIndex(t *testing.T) { testRedisLatestIndex(t, redisSingle(t)) }

func testRedisLatestIndex(t *testing.T, r redisTarget) {
	const stream = "{ix}"
	b := dialRedis(t, r.with(broker.RedisConfig{Stream: stream}))
	want := make(map[string]string)
	c := publish(t, b, []broker.Outgoing{
		{Subject: "db.a.1", Data: []byte(`1`)},
		{Subject: "db.a.2", Data: []byte(`1`), ID: "x"},
		{Subject: "db.a.1", Data: []byte(`2`), ID: "y"},
	})
	want["db.a.1"], want["db.a.2"] = c[2], c[1]
	if got := redisIndex(t, r, stream); !maps.Equal(got, want) {
		t.Fatalf("after Publish: index %v, want %v", got, want)
	}
	c = publish(t, b, []broker.Outgoing{
		{Subject: "db.a.2", Data: []byte(`2`)},
		{Subject: "db.a.2", Data: []byte(`1`), ID: "x"}, // a repeat: the original's cursor, not the newest
	})
	want["db.a.2"] = c[0]
	if got := redisIndex(t, r, stream); !maps.Equal(got, want) {
		t.Fatalf("after a repeated id: index %v, want %v", got, want)
	}
	// Append, in two script calls; its messages are the newest of their subjects.
	var out []broker.Outgoing
	for i := range 300 {
		out = append(out, broker.Outgoing{Subject: fmt.Sprintf("db.b.%d", i%40), Data: fmt.Appendf(nil, "%d", i), ID: broker.WriterID("w", fmt.Sprint(i))})
	}
	out = append(out, broker.Outgoing{Subject: "db.a.1", Data: []byte(`3`)}, broker.Outgoing{Subject: "db.a.2", Data: []byte(`1`), ID: "x"})
	appendAs(t, b, "w", out)
	stored := replayAll(t, b, "", "rs:99999999999999-0")
	for _, m := range stored {
		want[m.Subject] = m.Cursor
	}
	if got := redisIndex(t, r, stream); !maps.Equal(got, want) || len(want) != 42 {
		t.Fatalf("after Append: index %v, want %v", got, want)
	}
	err := b.Append(t.Context(), []broker.Outgoing{{Subject: "db.a.1", Data: []byte(`4`), ID: broker.WriterID("w", "late")}},
		broker.AppendOptions{Writer: "w", Check: true, Last: "w:0"})
	if !errors.Is(err, broker.ErrConflict) {
		t.Fatalf("Append expecting a stale mark: %v, want ErrConflict", err)
	}
	if got := redisIndex(t, r, stream); !maps.Equal(got, want) {
		t.Fatalf("after a refused Append: index %v, want %v", got, want)
	}
	msgs, _, _ := latestOf(t, b, nil)
	got := make(map[string]string)
	for _, m := range msgs {
		got[m.Subject] = m.Cursor
	}
	if !maps.Equal(got, want) {
		t.Fatalf("Latest: %v, want %v", got, want)
	}
}

// TestRedisLatestSkipsTrimmed: entries trimmed away and still in the
// index (an XTRIM by hand, which the appends' prune does not follow; or
// MAXLEN, before the prune reached them) are skipped and their index
// fields deleted, but not a field that names a newer entry appended
// meanwhile.
func TestRedisLatestSkipsTrimmed(t *testing.T) { testRedisLatestSkipsTrimmed(t, redisSingle(t)) }

func testRedisLatestSkipsTrimmed(t *testing.T, r redisTarget) {
	const stream = "{tr}"
	b := dialRedis(t, r.with(broker.RedisConfig{Stream: stream}))
	var out []broker.Outgoing
	for i := range 500 {
		out = append(out, broker.Outgoing{Subject: fmt.Sprintf("db.t.%d", i), Data: fmt.Appendf(nil, "%d", i), ID: broker.WriterID("w", fmt.Sprint(i))})
	}
	appendAs(t, b, "w", out[:250])
	publish(t, b, out[250:])
	if err := r.raw.XTrimMaxLen(t.Context(), stream, 50).Err(); err != nil {
		t.Fatal(err)
	}
	if n := len(redisIndex(t, r, stream)); n != 500 {
		t.Fatalf("index holds %d subjects before Latest, want 500", n)
	}
	// Between Latest's read of the index and its fetches, the first
	// subject (trimmed long ago) gets a new entry.
	var again string
	broker.SetRedisLatestHooks(b, nil, func() {
		again = publish(t, b, []broker.Outgoing{{Subject: "db.t.0", Data: []byte(`"again"`)}})[0]
	})
	msgs, _, through := latestOf(t, b, nil)
	retained := replayAll(t, b, "", through)
	if len(retained) == 0 || len(retained) >= 250 {
		t.Fatalf("the stream retains %d of 500 entries: want MAXLEN ~ 50 to have trimmed most", len(retained))
	}
	var got, want []string
	for _, m := range msgs {
		got = append(got, m.Subject+"="+string(m.Data))
	}
	for _, m := range retained {
		want = append(want, m.Subject+"="+string(m.Data))
	}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("Latest delivered %d: %v\nwant the %d retained: %v", len(got), got, len(want), want)
	}
	index := redisIndex(t, r, stream)
	if len(index) != len(retained)+1 || index["db.t.0"] != again {
		t.Fatalf("index after Latest: %d fields, db.t.0 → %s; want the %d retained subjects and db.t.0 → %s", len(index), index["db.t.0"], len(retained), again)
	}
	for _, m := range retained {
		if index[m.Subject] != m.Cursor {
			t.Fatalf("index: %s → %s, want %s", m.Subject, index[m.Subject], m.Cursor)
		}
	}
}

// TestRedisLatestOnCluster runs Latest's Redis tests on one 3-node Redis
// Cluster (a cluster each would more than double the time of the Latest
// tests): the append scripts, HSCAN, the pipelined fetches and the
// cleanup script must all go to the primary that owns the stream's slot.
func TestRedisLatestOnCluster(t *testing.T) {
	t.Parallel()
	r := redisCluster(t)
	t.Run("index", func(t *testing.T) { testRedisLatestIndex(t, r) })
	t.Run("trimmed", func(t *testing.T) { testRedisLatestSkipsTrimmed(t, r) })
	t.Run("pruned", func(t *testing.T) { testRedisLatestIndexPruned(t, r) })
	t.Run("newest", func(t *testing.T) { testLatestNewestOfEachSubject(t, onRedisStreams(t, r)) })
	t.Run("filters", func(t *testing.T) { testLatestFilters(t, onRedisStreams(t, r)) })
	t.Run("limit", func(t *testing.T) { testLatestLimit(t, onRedisStreams(t, r)) })
	t.Run("while publishing", func(t *testing.T) { testLatestWhilePublishing(t, onRedisStreams(t, r)) })
}

// TestRedisLatestIndexPruned publishes 50,000 subjects, each once, into a
// stream kept to about 1,000 entries, through both write paths: the index
// of each subject's newest entry must shrink with the stream (the append
// scripts prune the fields of trimmed entries as they go), not keep a
// field per subject ever published; and Latest still delivers exactly
// the newest retained entry of each subject, a subject written again
// after its entry was pruned included.
func TestRedisLatestIndexPruned(t *testing.T) { testRedisLatestIndexPruned(t, redisSingle(t)) }

func testRedisLatestIndexPruned(t *testing.T, r redisTarget) {
	const stream, subjects, maxLen = "{pr}", 50_000, 1000
	b := dialRedis(t, r.with(broker.RedisConfig{Stream: stream, MaxLen: maxLen}))
	ratio := 0.0 // the largest HLEN/XLEN seen after a call
	var out []broker.Outgoing
	for i := range subjects {
		out = append(out, broker.Outgoing{Subject: fmt.Sprintf("db.t.%d", i), Data: fmt.Appendf(nil, "%d", i), ID: broker.WriterID("w", fmt.Sprint(i))})
		if len(out) < 500 && i < subjects-1 {
			continue
		}
		if i/500%2 == 0 {
			appendAs(t, b, "w", out)
		} else {
			for j := range out {
				out[j].ID = "" // Publish, as the gateway's publishers do
			}
			publish(t, b, out)
		}
		out = out[:0]
		hlen, xlen := r.raw.HLen(t.Context(), stream+":latest").Val(), r.raw.XLen(t.Context(), stream).Val()
		ratio = max(ratio, float64(hlen)/float64(xlen))
	}
	// Subjects pruned long ago, written again, and one written twice.
	again := publish(t, b, []broker.Outgoing{{Subject: "db.t.0", Data: []byte(`"a"`)}, {Subject: "db.t.1", Data: []byte(`"a"`)}, {Subject: "db.t.0", Data: []byte(`"b"`)}})
	hlen, xlen := r.raw.HLen(t.Context(), stream+":latest").Val(), r.raw.XLen(t.Context(), stream).Val()
	t.Logf("after %d subjects: the index holds %d fields, the stream %d entries; at most %.2f fields per entry after a call", subjects, hlen, xlen, ratio)
	if ratio > 2.5 || hlen > 2*xlen+500 {
		t.Fatalf("the index holds %d fields for a stream of %d entries (up to %.1f per entry): want a small multiple of the stream's length", hlen, xlen, ratio)
	}

	msgs, _, through := latestOf(t, b, nil)
	want := newest(replayAll(t, b, "", through))
	if len(msgs) != len(want) {
		t.Fatalf("Latest delivered %d subjects, the stream retains %d", len(msgs), len(want))
	}
	for _, m := range msgs {
		if w := want[m.Subject]; m.Cursor != w.Cursor || string(m.Data) != string(w.Data) {
			t.Fatalf("%s: delivered %s %s, its newest retained is %s %s", m.Subject, m.Cursor, m.Data, w.Cursor, w.Data)
		}
	}
	if w := want["db.t.0"]; w.Cursor != again[2] || want["db.t.1"].Cursor != again[1] {
		t.Fatalf("db.t.0 at %s, db.t.1 at %s; want %s and %s", w.Cursor, want["db.t.1"].Cursor, again[2], again[1])
	}
}
