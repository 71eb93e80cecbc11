package gateway_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if any goroutine outlives the tests: every
// server, connection, writer and ping goroutine must be stopped and waited for.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
