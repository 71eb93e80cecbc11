package metrics_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if a test's owner or scraper goroutine outlives it.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
