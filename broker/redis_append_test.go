package broker_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/fanwire/fanwire/broker"
)

func TestRedisAppend(t *testing.T) { onRedis(t, testRedisAppend) }

// testRedisAppend: Append stores in order, skips ids it has seen (in the
// same call, in an earlier one, or published by Publish), appends messages
// without an id every time, spans several script calls, and keeps the
// writer's high water at its last stored message.
func testRedisAppend(t *testing.T, r redisTarget) {
	b := dialRedis(t, r.with(broker.RedisConfig{Stream: "{a}"}))
	ctx := t.Context()
	checkLastID(t, b, "w", nil, "", "before any append")
	if _, err := b.Publish(ctx, []broker.Outgoing{{Subject: "db.t.0", Data: []byte(`0`), ID: "w:e0"}}); err != nil {
		t.Fatal(err)
	}
	var msgs []broker.Outgoing
	for i := range 600 { // three script calls
		msgs = append(msgs, broker.Outgoing{Subject: fmt.Sprintf("db.t.%d", i%7), Data: fmt.Appendf(nil, "%d", i), ID: fmt.Sprintf("w:e%d", i)})
	}
	msgs = slices.Insert(msgs, 300, broker.Outgoing{Subject: "app.x", Data: []byte(`x`)})              // no id
	msgs = slices.Insert(msgs, 400, broker.Outgoing{Subject: "db.t.1", Data: []byte(`1`), ID: "w:e1"}) // a repeat in the same call
	if err := b.Append(ctx, msgs, broker.AppendOptions{Writer: "w"}); err != nil {
		t.Fatal(err)
	}
	checkLastID(t, b, "w", nil, "w:e599", "after the first append")
	// Again, with new ones after the known ones: only the new are stored
	// (e0 came from Publish, so the first append skipped it too).
	more := append(slices.Clone(msgs[501:]), broker.Outgoing{Subject: "db.t.9", Data: []byte(`600`), ID: "w:e600"})
	if err := b.Append(ctx, more, broker.AppendOptions{Writer: "w"}); err != nil {
		t.Fatal(err)
	}
	checkLastID(t, b, "w", nil, "w:e600", "after the second append")
	got := redisData(t, b)
	var want []string
	for i := range 601 {
		want = append(want, fmt.Sprint(i))
		if i == 299 {
			want = append(want, "x")
		}
	}
	if !slices.Equal(got, want) {
		t.Fatalf("stream holds %d messages:\n%s\nwant %d:\n%s", len(got), strings.Join(got, " "), len(want), strings.Join(want, " "))
	}
}

// redisData is the data of every message b's stream holds, in order.
func redisData(t *testing.T, b *broker.Redis) []string {
	t.Helper()
	var got []string
	if err := b.Replay(t.Context(), nil, "", "rs:99999999999999-0", func(ms []broker.Message) error {
		for _, m := range ms {
			got = append(got, string(m.Data))
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return got
}
