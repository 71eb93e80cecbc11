package broker_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fanwire/fanwire/broker"
	"github.com/fanwire/fanwire/broker/brokertest"
)

// TestJetStreamShortLivedReadsSurviveALostPull loses the first pull
// request of a replay and of a snapshot (Latest) on its way to the server.
// On a 3-node cluster the server now and then never holds the first pull
// sent to a new consumer on another node (consumer info: nothing delivered,
// none waiting, all pending); nats.go does not pull again, as its check
// for missed heartbeats restarts with every Next. Both reads waited
// forever for it (a resume on a cluster got no "subscribed"); they must
// pull again and deliver everything.
func TestJetStreamShortLivedReadsSurviveALostPull(t *testing.T) {
	t.Parallel()
	ns := brokertest.NATS(t)
	p := startPullDropper(t, ns.Addr().String())
	b := dialJS(t, broker.JetStreamConfig{NATSConfig: broker.NATSConfig{URL: "nats://" + p.Addr(), Subjects: []string{"db.>"}}, Stream: "L"})
	var out []broker.Outgoing
	for i := range 300 {
		out = append(out, broker.Outgoing{Subject: fmt.Sprint("db.a.", i%10), Data: []byte(fmt.Sprint(i))})
	}
	cursors, err := b.Publish(t.Context(), out)
	if err != nil {
		t.Fatal(err)
	}
	collect := func(got *[]string) func([]broker.Message) error {
		return func(ms []broker.Message) error {
			for _, m := range ms {
				*got = append(*got, m.Cursor)
			}
			return nil
		}
	}
	for _, tc := range []struct {
		name string
		read func(ctx context.Context) ([]string, error)
		want []string
	}{
		{"replay", func(ctx context.Context) ([]string, error) {
			var got []string
			err := b.Replay(ctx, []string{"db.>"}, cursors[99], cursors[299], collect(&got))
			return got, err
		}, cursors[100:]},
		{"latest", func(ctx context.Context) ([]string, error) {
			var got []string
			_, err := b.Latest(ctx, []string{"db.>"}, 0, collect(&got))
			return got, err
		}, cursors[290:]}, // the newest of each of the 10 subjects
	} {
		t.Run(tc.name, func(t *testing.T) {
			p.drop.Store(true)
			// A bound, not a wait: the read notices the lost pull after
			// one stall (2 s).
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			got, err := tc.read(ctx)
			if err != nil || !slices.Equal(got, tc.want) {
				t.Fatalf("%s whose first pull request was lost: %d cursors %v, %v; want %d", tc.name, len(got), got, err, len(tc.want))
			}
			if p.drop.Load() {
				t.Fatal("the proxy dropped no pull request: the test did not test a lost one")
			}
		})
	}
}

// pullDropper forwards TCP to a NATS server and, when armed, drops the
// next JetStream pull request a client sends (a PUB to
// $JS.API.CONSUMER.MSG.NEXT.<stream>.<consumer>): one the server never
// gets. It reads the client's protocol a command at a time, so a request
// split across reads is dropped whole.
type pullDropper struct {
	*brokertest.Proxy
	drop atomic.Bool // armed; cleared when it drops one
}

func startPullDropper(t *testing.T, server string) *pullDropper {
	t.Helper()
	p := &pullDropper{}
	p.Proxy = brokertest.StartProxy(t, server, brokertest.ProxyConfig{ToServer: clientPublishes(func(_ context.Context, subject string) bool {
		return !strings.HasPrefix(subject, "$JS.API.CONSUMER.MSG.NEXT.") || !p.drop.CompareAndSwap(true, false)
	})})
	return p
}

// clientPublishes is a Pipe for a NATS client's side of a connection: it
// reads the client's protocol a command at a time (a PUB or HPUB with its
// payload, so that one split across reads is handled whole) and forwards
// each, but first asks pub about every publish, by subject: pub may wait,
// and returns false to drop it.
func clientPublishes(pub func(ctx context.Context, subject string) bool) brokertest.Pipe {
	return func(ctx context.Context, dst io.Writer, src io.Reader) {
		r := bufio.NewReader(src)
		for {
			cmd, err := r.ReadBytes('\n')
			if err != nil {
				return
			}
			// PUB subject [reply] size, HPUB subject [reply] hsize size:
			// the payload and its CRLF follow.
			if f := strings.Fields(string(cmd)); len(f) >= 3 && (f[0] == "PUB" || f[0] == "HPUB") {
				size, err := strconv.Atoi(f[len(f)-1])
				if err != nil {
					return
				}
				payload := make([]byte, size+2)
				if _, err := io.ReadFull(r, payload); err != nil {
					return
				}
				if !pub(ctx, f[1]) {
					continue
				}
				cmd = append(cmd, payload...)
			}
			if _, err := dst.Write(cmd); err != nil {
				return
			}
		}
	}
}
