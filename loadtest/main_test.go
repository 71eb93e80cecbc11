package loadtest

import (
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"go.uber.org/goleak"
)

// TestMain fails the package if any test leaves a goroutine behind: Run
// promises that every goroutine it starts has exited when it returns.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// startNATS runs an embedded NATS server on a free port for the test and
// returns its client URL. (Swap for brokertest.NATS once that helper lands.)
func startNATS(t *testing.T) string {
	t.Helper()
	ns, err := server.NewServer(&server.Options{
		Host:   "127.0.0.1",
		Port:   server.RANDOM_PORT,
		NoSigs: true,
		NoLog:  true,
	})
	if err != nil {
		t.Fatalf("nats server: %v", err)
	}
	ns.Start()
	t.Cleanup(func() {
		ns.Shutdown()
		ns.WaitForShutdown()
	})
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats server not ready after 10s")
	}
	return ns.ClientURL()
}
