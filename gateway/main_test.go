package gateway_test

import (
	"testing"

	"github.com/fanwire/fanwire/broker/brokertest"
)

// TestMain fails the package if any goroutine outlives the tests: every
// server, connection, writer and ping goroutine must be stopped and waited for.
func TestMain(m *testing.M) {
	brokertest.VerifyTestMain(m) // goleak, waiting for embedded NATS servers' file stores to finish
}
