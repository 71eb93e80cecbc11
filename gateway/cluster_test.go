package gateway_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fanwire/fanwire/broker"
	"github.com/fanwire/fanwire/broker/brokertest"
	"github.com/fanwire/fanwire/gateway"
	"github.com/nats-io/nats-server/v2/server"
)

// clusterURLs is every node's client URL, comma-separated, as a client that
// must fail over is configured.
func clusterURLs(nodes []*server.Server) string {
	urls := make([]string, len(nodes))
	for i, ns := range nodes {
		urls[i] = ns.ClientURL()
	}
	return strings.Join(urls, ",")
}

// r3 makes the gateway's stream a replicated file stream, as on a cluster.
func r3(c *broker.JetStreamConfig) {
	c.Storage = "file"
	c.Replicas = 3
}

// streamLeader returns the node that leads the gateway's stream, from the
// stream info a client gets.
func streamLeader(t *testing.T, nodes []*server.Server) *server.Server {
	t.Helper()
	js := brokertest.JetStream(t, clusterURLs(nodes))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, "FANWIRE")
	if err != nil {
		t.Fatal(err)
	}
	info := s.CachedInfo()
	if info.Cluster == nil || len(info.Cluster.Replicas) != 2 {
		t.Fatalf("stream cluster info %+v: want a leader and 2 replicas", info.Cluster)
	}
	for _, ns := range nodes {
		if ns.Name() == info.Cluster.Leader {
			return ns
		}
	}
	t.Fatalf("stream leader %q is none of the nodes", info.Cluster.Leader)
	return nil
}

// TestClusterStreamLeaderLoss runs two gateways on a 3-node NATS cluster
// with an R3 stream, one attached to the stream leader's node and one to
// another node, and stops the leader's node while events are published.
// Nothing acknowledged to the publisher is lost: the clients of both
// gateways get every event exactly once, in order. The gateway whose node
// died is not restarted: its NATS connection fails over to a surviving node
// (the cluster told it their URLs) and its live feed continues after the
// last event it dispatched. A client then resumes from a cursor on the
// surviving gateway and gets exactly the events after it.
func TestClusterStreamLeaderLoss(t *testing.T) {
	nodes := brokertest.NATSCluster(t, 3)
	// The publisher knows every node and creates the stream.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pub, err := broker.DialJetStream(ctx, broker.JetStreamConfig{
		NATSConfig: broker.NATSConfig{URL: clusterURLs(nodes), Subjects: []string{"orders.>", "app.>"}, Name: "publisher"},
		Storage:    "file",
		Replicas:   3,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	leader := streamLeader(t, nodes)
	var other *server.Server
	for _, ns := range nodes {
		if ns != leader {
			other = ns
			break
		}
	}
	subjects := func(c *gateway.Config) { c.Subjects = []string{"orders.>", "app.>"} }
	onLeader := startEnv(t, leader, "jetstream", r3, subjects)
	onOther := startEnv(t, other, "jetstream", r3, subjects)
	ca, cb := onLeader.dial(), onOther.dial()
	ca.subscribe("s", "orders.*")
	cb.subscribe("s", "orders.*")

	// Events 1..total, one acknowledged publish at a time, so that the
	// stream's order is the numbering; the leader's node stops after
	// stopAt of them are acknowledged.
	const total, stopAt = 400, 150
	stopped := make(chan struct{})
	pubCtx, stopPub := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { // the publisher ends before the test does, even when it fails
		stopPub()
		wg.Wait()
	}()
	var pubErr error
	wg.Go(func() {
		for i := 1; i <= total; i++ {
			if i == stopAt+1 {
				leader.Shutdown()
				leader.WaitForShutdown()
				close(stopped)
			}
			pctx, cancel := context.WithTimeout(pubCtx, 30*time.Second)
			_, err := pub.Publish(pctx, []broker.Outgoing{{Subject: "orders.x", Data: []byte(strconv.Itoa(i)), ID: fmt.Sprint("ev-", i)}})
			cancel()
			if err != nil {
				pubErr = fmt.Errorf("publish %d: %w", i, err)
				return
			}
		}
	})
	cursors := make([]string, total+1)
	for name, cl := range map[string]*client{"leader's node": ca, "surviving node": cb} {
		for i := 1; i <= total; i++ {
			m := cl.nextWithin(30 * time.Second)
			if m["type"] != "event" || m["data"] != float64(i) {
				t.Fatalf("client of the gateway on the %s: got %v, want event %d", name, m, i)
			}
			c, _ := m["cursor"].(string)
			if cursors[i] == "" {
				cursors[i] = c
			} else if cursors[i] != c {
				t.Fatalf("event %d has cursor %q on one gateway and %q on the other", i, cursors[i], c)
			}
		}
	}
	wg.Wait()
	if pubErr != nil {
		t.Fatal(pubErr)
	}
	<-stopped
	ca.quiet()
	cb.quiet()

	// A client that left before the node stopped resumes on the surviving
	// gateway: it gets exactly what it missed.
	const from = stopAt - 50
	again := onOther.dial()
	again.send(`{"type":"subscribe","id":"r","subject":"orders.*","from":"` + cursors[from] + `"}`)
	// A bound, not a wait: the resume creates a consumer on the cluster
	// that lost a node (its meta and stream leaders are elected by now:
	// both feeds and the publisher went on), and a first pull the server
	// never gets costs it 2 s (broker's pullLost). Its answer never came
	// before that was fixed: the replay waited for that pull forever.
	if m := again.nextWithin(30 * time.Second); m["type"] != "subscribed" || m["cursor"] != cursors[from] {
		t.Fatalf("resume: got %v, want subscribed with cursor %s", m, cursors[from])
	}
	for i := from + 1; i <= total; i++ {
		again.expect(map[string]any{"type": "event", "data": i, "cursor": cursors[i]})
	}
	again.quiet()
}
