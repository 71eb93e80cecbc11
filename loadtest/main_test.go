package loadtest

import (
	"context"
	"testing"
	"time"

	"github.com/fanwire/fanwire/broker"
	"github.com/fanwire/fanwire/broker/brokertest"
)

// TestMain fails the package if any test leaves a goroutine behind: Run
// promises that every goroutine it starts has exited when it returns.
func TestMain(m *testing.M) {
	brokertest.VerifyTestMain(m) // goleak, waiting for embedded NATS servers' file stores to finish
}

// startNATS runs an embedded NATS server on a free port for the test and
// returns its client URL.
func startNATS(t *testing.T) string {
	t.Helper()
	return brokertest.NATS(t).ClientURL()
}

// startNATSBroker starts an embedded NATS server and a Core NATS broker on
// it, closed after the test (after a gateway started later: cleanups run
// last-in first-out).
func startNATSBroker(t *testing.T) (natsURL string, b *broker.NATS) {
	t.Helper()
	natsURL = startNATS(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	b, err := broker.DialNATS(ctx, broker.NATSConfig{URL: natsURL})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return natsURL, b
}
