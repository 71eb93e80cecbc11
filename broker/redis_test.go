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

func dialRedis(t *testing.T, cfg broker.RedisConfig) *broker.Redis {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	b, err := broker.DialRedis(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b
}

func TestRedisPublishConsumeReplay(t *testing.T) {
	addr := brokertest.Redis(t)
	b := dialRedis(t, broker.RedisConfig{URL: "redis://" + addr, Stream: "{t}"})
	pre, err := b.Publish(context.Background(), []broker.Outgoing{{Subject: "a.0", Data: []byte(`0`)}})
	if err != nil {
		t.Fatal(err)
	}
	started := make(chan string, 1)
	c := &consumer{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- b.Consume(ctx, func(ms []broker.Message, _ time.Time) {
			c.mu.Lock()
			c.msgs = append(c.msgs, ms...)
			c.mu.Unlock()
		}, func(s string) { started <- s })
	}()
	defer func() { cancel(); <-done }()
	if s := <-started; s != pre[0] {
		t.Fatalf("live feed starts after %q, want %q", s, pre[0])
	}
	var out []broker.Outgoing
	for i := 1; i <= 300; i++ {
		out = append(out, broker.Outgoing{Subject: fmt.Sprintf("a.%d", i), Data: []byte(fmt.Sprint(i))})
	}
	cursors, err := b.Publish(context.Background(), out)
	if err != nil {
		t.Fatal(err)
	}
	got := c.waitFor(t, 300)
	for i, m := range got {
		if string(m.Data) != fmt.Sprint(i+1) || m.Cursor != cursors[i] {
			t.Fatalf("live %d: %q %q, want %d %q", i, m.Data, m.Cursor, i+1, cursors[i])
		}
	}
	var replayed []string
	err = b.Replay(context.Background(), nil, cursors[99], cursors[199], func(ms []broker.Message) error {
		for _, m := range ms {
			replayed = append(replayed, m.Cursor)
		}
		return nil
	})
	if err != nil || strings.Join(replayed, ",") != strings.Join(cursors[100:200], ",") {
		t.Fatalf("replay (c99, c199]: %d entries, %v", len(replayed), err)
	}
	if order, err := b.CompareCursors(cursors[1], cursors[0]); err != nil || order != 1 {
		t.Fatalf("CompareCursors: %d %v", order, err)
	}
	for _, bad := range []string{"js:1", "rs:x", "rs:1", "rs:99999999999999-0"} {
		err := b.Replay(context.Background(), nil, bad, cursors[1], func([]broker.Message) error { return nil })
		if !errors.Is(err, broker.ErrBadCursor) {
			t.Errorf("replay from %q: %v, want ErrBadCursor", bad, err)
		}
	}
}

// TestRedisReplayOfNoStream: before the first event the stream key does
// not exist; a cursor is then ahead of the stream, and replaying from the
// first replays nothing.
func TestRedisReplayOfNoStream(t *testing.T) {
	b := dialRedis(t, broker.RedisConfig{URL: "redis://" + brokertest.Redis(t), Stream: "{none}"})
	err := b.Replay(context.Background(), nil, "rs:1-0", "rs:2-0", func([]broker.Message) error { return nil })
	if !errors.Is(err, broker.ErrBadCursor) {
		t.Errorf("replay from a cursor of an empty stream: %v, want ErrBadCursor", err)
	}
	n := 0
	err = b.Replay(context.Background(), nil, "", "rs:2-0", func(ms []broker.Message) error { n += len(ms); return nil })
	if err != nil || n != 0 {
		t.Errorf("replay from the first of an empty stream: %d messages, %v; want none", n, err)
	}
}

func TestRedisExpiredCursor(t *testing.T) {
	addr := brokertest.Redis(t)
	b := dialRedis(t, broker.RedisConfig{URL: "redis://" + addr, Stream: "e", MaxLen: 10})
	var out []broker.Outgoing
	for i := range 1000 {
		out = append(out, broker.Outgoing{Subject: "x", Data: []byte(fmt.Sprint(i))})
	}
	cursors, err := b.Publish(context.Background(), out)
	if err != nil {
		t.Fatal(err)
	}
	err = b.Replay(context.Background(), nil, cursors[0], cursors[999], func([]broker.Message) error { return nil })
	if !errors.Is(err, broker.ErrCursorExpired) {
		t.Fatalf("replay from a trimmed cursor: %v, want ErrCursorExpired", err)
	}
}
