package broker_test

import (
	"errors"
	"fmt"
	"maps"
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
func TestRedisLatestIndex(t *testing.T) { onRedis(t, testRedisLatestIndex) }

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
}
