// Package brokertest starts real brokers for tests, the way net/http/httptest
// starts real HTTP servers: each on a free loopback port with its state in
// t.TempDir(), stopped by t.Cleanup. They fail the test loudly when something
// is missing; they never skip.
package brokertest

import (
	"testing"

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
