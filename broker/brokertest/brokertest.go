// Package brokertest starts real brokers for tests, the way net/http/httptest
// starts real HTTP servers: each on a free loopback port with its state in
// t.TempDir(), stopped by t.Cleanup. They fail the test loudly when something
// is missing; they never skip it, but for -short (make test-quick), which
// leaves out the tests that start clusters and server processes.
// VerifyTestMain is goleak's, waiting for embedded servers' goroutines.
package brokertest

import (
	"errors"
	"fmt"
	"net"
	"strings"
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

// errPortTaken: a server's port, free when freePort picked it, was taken
// by another process before the server bound it.
var errPortTaken = errors.New("port taken")

// portTaken is err wrapped in errPortTaken when what the server said (its
// error, or its log) is that its port is in use.
func portTaken(err error, said string) error {
	if strings.Contains(strings.ToLower(said), "address already in use") {
		return fmt.Errorf("%w: %w", errPortTaken, err)
	}
	return err
}

// startOnFreePorts calls start, which starts a server on ports freePort
// picks, again while it fails with errPortTaken (at most five times): a
// free port can be taken by any connection of the machine before the
// server binds it. Any other error fails the test.
func startOnFreePorts(t testing.TB, start func() error) {
	t.Helper()
	for attempt := 1; ; attempt++ {
		err := start()
		if err == nil {
			return
		}
		if !errors.Is(err, errPortTaken) || attempt == 5 {
			t.Fatalf("brokertest: %v", err)
		}
		t.Logf("brokertest: %v; starting again on other ports", err)
	}
}
