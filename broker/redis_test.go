package broker_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fanwire/fanwire/broker"
	"github.com/fanwire/fanwire/broker/brokertest"
	"github.com/redis/go-redis/v9"
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

// redisTarget is a real Redis to run a broker test on: its configuration
// (URL, Cluster) and a client of its own for the test to look inside.
type redisTarget struct {
	cfg broker.RedisConfig
	raw redis.UniversalClient
}

// onRedis runs test as subtests on one redis-server and on a 3-node Redis
// Cluster (whose stream keys the tests give hash tags).
func onRedis(t *testing.T, test func(t *testing.T, r redisTarget)) {
	t.Run("single", func(t *testing.T) { test(t, redisSingle(t)) })
	t.Run("cluster", func(t *testing.T) { test(t, redisCluster(t)) })
}

// redisSingle starts a redis-server to run a test on.
func redisSingle(t *testing.T) redisTarget {
	addr := brokertest.Redis(t)
	raw := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { _ = raw.Close() })
	return redisTarget{cfg: broker.RedisConfig{URL: "redis://" + addr}, raw: raw}
}

// redisCluster starts a 3-node Redis Cluster to run a test on.
func redisCluster(t *testing.T) redisTarget {
	addrs := brokertest.RedisCluster(t, 3)
	raw := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	t.Cleanup(func() { _ = raw.Close() })
	// One seed in the URL's host, the others as addr parameters.
	url := "redis://" + addrs[0] + "?addr=" + strings.Join(addrs[1:], "&addr=")
	return redisTarget{cfg: broker.RedisConfig{URL: url, Cluster: true}, raw: raw}
}

// with is r's configuration with the test's stream and settings.
func (r redisTarget) with(cfg broker.RedisConfig) broker.RedisConfig {
	cfg.URL, cfg.Cluster = r.cfg.URL, r.cfg.Cluster
	return cfg
}

func TestRedisPublishConsumeReplay(t *testing.T) { onRedis(t, testRedisPublishConsumeReplay) }

func testRedisPublishConsumeReplay(t *testing.T, r redisTarget) {
	b := dialRedis(t, r.with(broker.RedisConfig{Stream: "{t}"}))
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
	t.Parallel()
	onRedis(t, func(t *testing.T, r redisTarget) {
		b := dialRedis(t, r.with(broker.RedisConfig{Stream: "{none}"}))
		err := b.Replay(context.Background(), nil, "rs:1-0", "rs:2-0", func([]broker.Message) error { return nil })
		if !errors.Is(err, broker.ErrBadCursor) {
			t.Errorf("replay from a cursor of an empty stream: %v, want ErrBadCursor", err)
		}
		n := 0
		err = b.Replay(context.Background(), nil, "", "rs:2-0", func(ms []broker.Message) error { n += len(ms); return nil })
		if err != nil || n != 0 {
			t.Errorf("replay from the first of an empty stream: %d messages, %v; want none", n, err)
		}
	})
}

func TestRedisExpiredCursor(t *testing.T) {
	t.Parallel()
	onRedis(t, func(t *testing.T, r redisTarget) {
		// Messages with publish ids go through the dedup script, which trims too.
		for _, withIDs := range []bool{false, true} {
			t.Run(fmt.Sprintf("ids=%v", withIDs), func(t *testing.T) {
				stream := fmt.Sprintf("{e-%v}", withIDs) // a stream each, on one server
				b := dialRedis(t, r.with(broker.RedisConfig{Stream: stream, MaxLen: 10}))
				var out []broker.Outgoing
				for i := range 1000 {
					m := broker.Outgoing{Subject: "x", Data: []byte(fmt.Sprint(i))}
					if withIDs {
						m.ID = fmt.Sprint("id-", i)
					}
					out = append(out, m)
				}
				cursors, err := b.Publish(context.Background(), out)
				if err != nil {
					t.Fatal(err)
				}
				err = b.Replay(context.Background(), nil, cursors[0], cursors[999], func([]broker.Message) error { return nil })
				if !errors.Is(err, broker.ErrCursorExpired) {
					t.Fatalf("replay from a trimmed cursor: %v, want ErrCursorExpired", err)
				}
			})
		}
	})
}

// TestRedisPublishDeduplicates publishes with ids: a repeat within the
// window, in the same batch or a later one, is not appended again and gets
// the original cursor, as on JetStream; messages without an id are never
// deduplicated.
func TestRedisPublishDeduplicates(t *testing.T) { onRedis(t, testRedisPublishDeduplicates) }

func testRedisPublishDeduplicates(t *testing.T, r redisTarget) {
	b := dialRedis(t, r.with(broker.RedisConfig{Stream: "{d}"}))
	ctx := t.Context()
	first, err := b.Publish(ctx, []broker.Outgoing{
		{Subject: "a.1", Data: []byte(`1`), ID: "x"},
		{Subject: "a.2", Data: []byte(`2`)},
		{Subject: "a.1", Data: []byte(`1`), ID: "x"}, // a repeat in the same batch
		{Subject: "a.3", Data: []byte(`3`), ID: "y"},
		{Subject: "a.2", Data: []byte(`2`)}, // no id: appended again
	})
	if err != nil {
		t.Fatal(err)
	}
	if first[2] != first[0] {
		t.Errorf("repeated id in one batch: cursor %s, want the original %s", first[2], first[0])
	}
	again, err := b.Publish(ctx, []broker.Outgoing{
		{Subject: "a.3", Data: []byte(`3`), ID: "y"}, // a repeat in a later batch
		{Subject: "a.4", Data: []byte(`4`), ID: "z"},
	})
	if err != nil {
		t.Fatal(err)
	}
	if again[0] != first[3] {
		t.Errorf("repeated id in a later batch: cursor %s, want the original %s", again[0], first[3])
	}
	want := []string{first[0], first[1], first[3], first[4], again[1]}
	for i := 1; i < len(want); i++ {
		if order, err := b.CompareCursors(want[i-1], want[i]); err != nil || order >= 0 {
			t.Fatalf("cursors %v do not increase: %v", want, err)
		}
	}
	var stored []string
	err = b.Replay(ctx, nil, "", again[1], func(ms []broker.Message) error {
		for _, m := range ms {
			stored = append(stored, m.Cursor+"="+string(m.Data))
		}
		return nil
	})
	wantStored := []string{first[0] + "=1", first[1] + "=2", first[3] + "=3", first[4] + "=2", again[1] + "=4"}
	if err != nil || !slices.Equal(stored, wantStored) {
		t.Fatalf("stream holds %v (%v), want %v", stored, err, wantStored)
	}
	// The id is remembered under the stream key, so it shares the stream's
	// hash tag (one slot on Redis Cluster), and is forgotten after the window.
	raw := r.raw
	ttl, err := raw.PTTL(ctx, "{d}:dedup:x").Result()
	if err != nil || ttl <= 0 || ttl > broker.DefaultRedisDedupWindow {
		t.Errorf("dedup key {d}:dedup:x expires in %v (%v), want within %v", ttl, err, broker.DefaultRedisDedupWindow)
	}
	// A server that forgot the script (restarted, SCRIPT FLUSH; on a
	// cluster every primary) still publishes with ids, several in a batch.
	if err := raw.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	after, err := b.Publish(ctx, []broker.Outgoing{
		{Subject: "a.5", Data: []byte(`5`), ID: "v"},
		{Subject: "a.6", Data: []byte(`6`), ID: "u"},
		{Subject: "a.3", Data: []byte(`3`), ID: "y"},
	})
	if err != nil {
		t.Fatalf("publish after SCRIPT FLUSH: %v", err)
	}
	if after[2] != first[3] || after[0] == after[1] {
		t.Fatalf("publish after SCRIPT FLUSH: cursors %v, want two new ones, then the original %s", after, first[3])
	}
}

// TestRedisDedupWindowEnds publishes one id again until the window has
// passed: then it is a new event, after the original.
func TestRedisDedupWindowEnds(t *testing.T) { onRedis(t, testRedisDedupWindowEnds) }

func testRedisDedupWindowEnds(t *testing.T, r redisTarget) {
	b := dialRedis(t, r.with(broker.RedisConfig{Stream: "{w}", DedupWindow: 50 * time.Millisecond}))
	ctx := t.Context()
	msg := []broker.Outgoing{{Subject: "a", Data: []byte(`1`), ID: "once"}}
	orig, err := b.Publish(ctx, msg)
	if err != nil {
		t.Fatal(err)
	}
	var later string
	for deadline := time.Now().Add(10 * time.Second); later == ""; time.Sleep(10 * time.Millisecond) {
		c, err := b.Publish(ctx, msg)
		if err != nil {
			t.Fatal(err)
		}
		if c[0] != orig[0] {
			later = c[0]
		} else if time.Now().After(deadline) {
			t.Fatalf("id still deduplicated 10s after a 50ms window")
		}
	}
	var stored []string
	err = b.Replay(ctx, nil, "", later, func(ms []broker.Message) error {
		for _, m := range ms {
			stored = append(stored, m.Cursor)
		}
		return nil
	})
	if err != nil || !slices.Equal(stored, []string{orig[0], later}) {
		t.Fatalf("stream holds %v (%v), want the original %s and, after the window, %s", stored, err, orig[0], later)
	}
}

func TestRedisDedupWindowInvalid(t *testing.T) {
	t.Parallel()
	_, err := broker.DialRedis(t.Context(), broker.RedisConfig{URL: "redis://127.0.0.1:1", DedupWindow: -time.Second})
	if err == nil || !strings.Contains(err.Error(), "DedupWindow") {
		t.Fatalf("DialRedis with a negative window: %v, want an error naming DedupWindow", err)
	}
}

// TestRedisClusterNeedsHashTag: on Redis Cluster a stream key without a
// hash tag is refused at dial, naming the fix, and a single-node client
// pointed at a cluster node is refused too (it would fail with MOVED as
// soon as the stream's slot is on another node).
func TestRedisClusterNeedsHashTag(t *testing.T) {
	t.Parallel()
	addrs := brokertest.RedisCluster(t, 3)
	for _, stream := range []string{"fanwire", "{}fanwire", "fan{wire"} {
		_, err := broker.DialRedis(t.Context(), broker.RedisConfig{URL: "redis://" + addrs[0], Cluster: true, Stream: stream})
		if err == nil || !strings.Contains(err.Error(), "hash tag") || !strings.Contains(err.Error(), `"{`+stream+`}"`) {
			t.Errorf("cluster dial with stream %q: %v, want an error asking for a hash tag such as {%s}", stream, err, stream)
		}
	}
	_, err := broker.DialRedis(t.Context(), broker.RedisConfig{URL: "redis://" + addrs[0], Stream: "{fanwire}"})
	if err == nil || !strings.Contains(err.Error(), "Cluster") {
		t.Errorf("single-node dial of a cluster node: %v, want an error naming Cluster", err)
	}
	b := dialRedis(t, broker.RedisConfig{URL: "redis://" + addrs[1], Cluster: true, Stream: "x{fanwire}y"})
	if _, err := b.Publish(t.Context(), []broker.Outgoing{{Subject: "a", Data: []byte(`1`), ID: "1"}}); err != nil {
		t.Errorf("publish on a stream with a tag inside its key: %v", err)
	}
}
