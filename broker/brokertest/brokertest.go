// Package brokertest starts real brokers for tests, the way net/http/httptest
// starts real HTTP servers: each on a free loopback port with its state in
// t.TempDir(), stopped by t.Cleanup. They fail the test loudly when something
// is missing; they never skip.
package brokertest

import (
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/fanwire/fanwire/broker"
	"github.com/nats-io/nats-server/v2/server"
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

// RestartNATS shuts ns down and starts a new server on the same port with
// the same JetStream store, as a restarted broker; the new one is stopped
// by t.Cleanup. (The first server's cleanup is harmless on a stopped one.)
func RestartNATS(t testing.TB, ns *server.Server) *server.Server {
	t.Helper()
	port := ns.Addr().(*net.TCPAddr).Port
	dir := filepath.Dir(ns.StoreDir())
	ns.Shutdown()
	ns.WaitForShutdown()
	var err error
	for range 50 { // the port is free again once the old listener is closed
		var n *server.Server
		if n, err = broker.StartEmbedded(broker.EmbeddedConfig{Port: port, JetStream: true, StoreDir: dir}); err == nil {
			t.Cleanup(func() {
				n.Shutdown()
				n.WaitForShutdown()
			})
			return n
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("brokertest: restart NATS on port %d: %v", port, err)
	return nil
}
