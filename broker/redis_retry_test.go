package broker_test

import (
	"context"
	"fmt"
	"io"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fanwire/fanwire/broker"
	"github.com/fanwire/fanwire/broker/brokertest"
	"github.com/redis/go-redis/v9"
)

// TestRedisPublishRetryKeepsOrder loses the server's replies to a Publish
// (the connection drops once the server has run a script call: one per
// 1,000 messages, so the last run's 2,500 take three). With ids, go-redis
// sends the call again on a new connection and the repeats are
// recognized: each message stored once, in order, with its cursor. With
// messages without an id among them, an XADD run again would append its
// message twice, after the later ones (750 entries for 500 messages, when
// Publish sent plain XADDs): Publish returns the error, and the stream
// holds a prefix of the messages, each once.
func TestRedisPublishRetryKeepsOrder(t *testing.T) {
	t.Parallel()
	for _, allIDs := range []bool{true, false} {
		for run := range 3 {
			t.Run(fmt.Sprint("ids=", allIDs, "/", run), func(t *testing.T) {
				addr := brokertest.Redis(t)
				// An array: the script's entry ids, not the connection's
				// handshake (a map, and simple strings).
				p := startCuttingProxy(t, addr, func(chunk []byte) bool { return chunk[0] == '*' })
				b := dialRedis(t, broker.RedisConfig{URL: "redis://" + p.Addr(), Stream: "retry"})
				var out []broker.Outgoing
				for i := range []int{200, 500, 2500}[run] {
					m := broker.Outgoing{Subject: "db.t", Data: []byte(fmt.Sprint(i))}
					if allIDs || i%2 == 1 {
						m.ID = fmt.Sprint("id-", i)
					}
					out = append(out, m)
				}
				p.cut.Store(true) // the next reply from the server is lost with its connection
				ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
				defer cancel()
				cursors, err := b.Publish(ctx, out)
				if p.cut.Load() {
					t.Fatal("no reply was cut: the test did not test a retry")
				}
				if allIDs && err != nil {
					t.Fatalf("Publish with ids: %v", err)
				}
				if !allIDs && err == nil {
					t.Fatal("Publish with messages without ids succeeded after its replies were lost: it sent them again")
				}
				raw := redis.NewClient(&redis.Options{Addr: addr})
				defer raw.Close()
				xs, err := raw.XRange(ctx, "retry", "-", "+").Result()
				if err != nil {
					t.Fatal(err)
				}
				if len(xs) > len(out) || allIDs && len(xs) != len(out) {
					t.Errorf("%d entries stored for %d messages", len(xs), len(out))
				}
				for i, x := range xs[:min(len(xs), len(out))] {
					if d := x.Values["d"].(string); d != string(out[i].Data) {
						t.Fatalf("entry %d is message %s, want %s", i, d, out[i].Data)
					}
					if allIDs && cursors[i] != broker.CursorPrefixRedis+x.ID {
						t.Fatalf("cursor %d = %s, want the entry's rs:%s", i, cursors[i], x.ID)
					}
				}
			})
		}
	}
}

// cuttingProxy forwards TCP to a server; while cut is set, it closes the
// first connection on which the server sends a chunk that cutIf accepts,
// dropping the chunk, and clears cut.
type cuttingProxy struct {
	*brokertest.Proxy
	cut atomic.Bool
}

func startCuttingProxy(t *testing.T, server string, cutIf func(chunk []byte) bool) *cuttingProxy {
	t.Helper()
	p := &cuttingProxy{}
	p.Proxy = brokertest.StartProxy(t, server, brokertest.ProxyConfig{FromServer: func(_ context.Context, dst io.Writer, src io.Reader) {
		buf := make([]byte, 64<<10)
		for {
			n, err := src.Read(buf)
			if n > 0 {
				if p.cut.Load() && cutIf(buf[:n]) && p.cut.CompareAndSwap(true, false) {
					return
				}
				if _, err := dst.Write(buf[:n]); err != nil {
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
