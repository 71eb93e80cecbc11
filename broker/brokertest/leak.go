package brokertest

import (
	"fmt"
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// leakWait is how long VerifyTestMain waits for goroutines to end after
// the tests: an embedded nats-server's file-store goroutines
// ((*msgBlock).flushLoop) can still be finishing a write when its Shutdown
// returns, seconds later on a loaded machine.
const leakWait = 30 * time.Second

// VerifyTestMain runs a package's tests and then, as
// goleak.VerifyTestMain does, fails the package if a goroutine outlives
// them; but it waits up to leakWait for the goroutines to end first,
// where goleak alone gives them about 0.4 s. A goroutine that never ends
// still fails the package, with goleak's report. One did, once in a dozen
// fresh runs: a stream's file store ((*msgBlock).flushLoop,
// (*fileStore).flushStreamStateLoop and the ats goroutine it keeps
// registered), idle for a minute, of a server otherwise shut down. The
// path we found for it is a cluster node re-creating a stream replica
// while it stops, which NATSCluster's cleanup now leaves nothing to do
// (see stopCluster).
func VerifyTestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		deadline := time.Now().Add(leakWait)
		err := goleak.Find()
		for err != nil && time.Now().Before(deadline) {
			time.Sleep(100 * time.Millisecond)
			err = goleak.Find()
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "goleak: goroutines outlived the tests by %v: %v\n", leakWait, err)
			code = 1
		}
	}
	os.Exit(code)
}
