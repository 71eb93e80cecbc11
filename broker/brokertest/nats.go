package brokertest

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fanwire/fanwire/broker"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// NATS starts an embedded NATS server with JetStream and returns it; its
// ClientURL() is the URL to connect to.
func NATS(t testing.TB) *server.Server {
	t.Helper()
	ns, err := broker.StartEmbedded(broker.EmbeddedConfig{JetStream: true, StoreDir: t.TempDir()})
	if err != nil {
		t.Fatalf("brokertest: %v", err)
	}
	t.Cleanup(func() {
		ns.Shutdown()
		ns.WaitForShutdown()
	})
	return ns
}

// NATSCluster starts an n-node NATS cluster in this process: embedded
// servers with JetStream (each with its own store in t.TempDir() and its own
// name), routed to each other on loopback. It returns once the routes are up
// and JetStream has a meta leader that sees every node, so a stream with up
// to n replicas can be created at once. The nodes are stopped by t.Cleanup;
// stop one earlier, as a failed machine, with Shutdown and WaitForShutdown.
// Connect to several with a comma-separated list of their ClientURL()s.
func NATSCluster(t testing.TB, n int) []*server.Server {
	t.Helper()
	if testing.Short() {
		t.Skip("-short (make test-quick) leaves out the tests that start a NATS cluster: make test runs them")
	}
	var nodes []*server.Server
	t.Cleanup(func() { stopCluster(nodes) })
	startOnFreePorts(t, func() error {
		var err error
		if nodes, err = startCluster(t, n); err != nil {
			stopCluster(nodes)
			nodes = nil
		}
		return err
	})
	// A meta leader that counts every node as a peer (it has heard from
	// each) can place n replicas; before that, creating an R3 stream fails
	// with "insufficient resources".
	formed := func() bool {
		leaders := 0
		for _, ns := range nodes {
			if !ns.JetStreamIsCurrent() {
				return false
			}
			if ns.JetStreamIsLeader() {
				leaders++
				if len(ns.JetStreamClusterPeers()) != n {
					return false
				}
			}
		}
		return leaders == 1
	}
	deadline := time.Now().Add(30 * time.Second)
	for !formed() {
		if time.Now().After(deadline) {
			t.Fatalf("brokertest: %d-node NATS cluster not formed after 30s", n)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// And the JetStream API answers a client on every node.
	for _, ns := range nodes {
		if err := jetStreamAnswers(ns, deadline); err != nil {
			t.Fatalf("brokertest: JetStream on %s: %v", ns.Name(), err)
		}
	}
	return nodes
}

// startCluster starts n nodes on free route ports, each naming every
// node's route; it returns the nodes started, with the first error
// (errPortTaken when a route port was taken).
func startCluster(t testing.TB, n int) ([]*server.Server, error) {
	routes := make([]string, n)
	ports := make([]int, n)
	for i := range n {
		ports[i] = freePort(t)
		routes[i] = "nats-route://127.0.0.1:" + strconv.Itoa(ports[i])
	}
	nodes := make([]*server.Server, 0, n)
	for i := range n {
		ns, err := broker.StartEmbedded(broker.EmbeddedConfig{
			JetStream:  true,
			StoreDir:   t.TempDir(),
			ServerName: "node-" + strconv.Itoa(i),
			Cluster:    &broker.EmbeddedCluster{Name: "fanwire-test", Port: ports[i], Routes: routes},
		})
		if err != nil {
			return nodes, portTaken(fmt.Errorf("cluster node %d: %w", i, err), err.Error())
		}
		nodes = append(nodes, ns)
	}
	return nodes, nil
}

// stopCluster deletes the cluster's streams and then stops its nodes.
// Stopped one at a time with their streams, the nodes left behind lose a
// stream leader; nats-server (2.15) re-creates a replica whose catch-up
// that aborted (resetClusteredState, in a goroutine no Shutdown waits
// for), and it checks that its node is not shutting down only before it
// starts: a replica re-created while the node stops is a stream store,
// with its flush goroutines, that nothing stops. That is the one path we
// found by which such a store outlives its server, the leak goleak
// reported once in a dozen fresh runs. Without streams there is nothing
// to catch up.
func stopCluster(nodes []*server.Server) {
	var urls []string
	for _, ns := range nodes {
		if ns.Running() {
			urls = append(urls, ns.ClientURL())
		}
	}
	if len(urls) > 0 {
		if nc, err := nats.Connect(strings.Join(urls, ","), nats.NoReconnect()); err == nil {
			if js, err := jetstream.New(nc); err == nil {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				for name := range js.StreamNames(ctx).Name() {
					_ = js.DeleteStream(ctx, name) // best effort: the cluster may have lost its quorum in the test
				}
				cancel()
			}
			nc.Close()
		}
	}
	for _, ns := range slices.Backward(nodes) {
		ns.Shutdown()
		ns.WaitForShutdown()
	}
}

// jetStreamAnswers polls the JetStream API through a client of ns until it
// answers or deadline passes.
func jetStreamAnswers(ns *server.Server, deadline time.Time) error {
	for {
		err := jetStreamAnswersAt(ns.ClientURL(), ns.Name())
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// RestartNATS shuts ns down and starts a new server on the same port with
// the same JetStream store, as a restarted broker; the new one is stopped
// by t.Cleanup. (The first server's cleanup is harmless on a stopped one.)
func RestartNATS(t testing.TB, ns *server.Server) *server.Server {
	t.Helper()
	port, dir := Port(ns), StoreDir(ns)
	ns.Shutdown()
	ns.WaitForShutdown()
	return NATSWithStore(t, dir, port)
}

// Port is the client port of ns.
func Port(ns *server.Server) int { return ns.Addr().(*net.TCPAddr).Port }

// StoreDir is the JetStream store of ns, as NATSWithStore takes it.
func StoreDir(ns *server.Server) string { return filepath.Dir(ns.StoreDir()) }

// NATSWithStore starts an embedded JetStream server with the store dir of
// a server that is stopped (see StoreDir), on port (0: a free one), and
// stops it by t.Cleanup. Started on another port, it lets a test change a
// stopped broker's data while that broker's clients cannot reach it.
func NATSWithStore(t testing.TB, dir string, port int) *server.Server {
	t.Helper()
	var err error
	for range 50 { // a port is free again once the old listener is closed
		var ns *server.Server
		if ns, err = broker.StartEmbedded(broker.EmbeddedConfig{Port: port, JetStream: true, StoreDir: dir}); err == nil {
			t.Cleanup(func() {
				ns.Shutdown()
				ns.WaitForShutdown()
			})
			return ns
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("brokertest: start NATS on port %d with the store in %s: %v", port, dir, err)
	return nil
}

// JetStream connects a JetStream client to url (several comma-separated
// for a cluster), for tests that inspect or drive streams directly; the
// connection is closed by t.Cleanup.
func JetStream(t testing.TB, url string) jetstream.JetStream {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatalf("brokertest: connect %s: %v", url, err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatalf("brokertest: jetstream: %v", err)
	}
	return js
}
