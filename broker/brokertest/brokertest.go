// Package brokertest starts real brokers for tests, the way net/http/httptest
// starts real HTTP servers: each on a free loopback port with its state in
// t.TempDir(), stopped by t.Cleanup. They fail the test loudly when something
// is missing; they never skip it, but for -short (make test-quick), which
// leaves out the tests that start clusters and server processes.
// VerifyTestMain is goleak's, waiting for embedded servers' goroutines.
package brokertest

import (
	"net"
	"testing"
)

// freePort returns a loopback port that was free a moment ago, for servers
// that must be told their port before they start.
func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("brokertest: free port: %v", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
