package loadtest

import (
	"testing"

	"github.com/fanwire/fanwire/broker/brokertest"
	"go.uber.org/goleak"
)

// TestMain fails the package if any test leaves a goroutine behind: Run
// promises that every goroutine it starts has exited when it returns.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// startNATS runs an embedded NATS server on a free port for the test and
// returns its client URL.
func startNATS(t *testing.T) string {
	t.Helper()
	return brokertest.NATS(t).ClientURL()
}
