package gateway

import (
	"strings"
	"testing"

	"github.com/fanwire/fanwire/gateway/internal/fanout"
)

// TestFlusherDeliveryAllocs: a native delivery written by a shared
// flusher's turn (queued in the mailbox, taken, framed by the gateway and
// written without blocking to a real socket) allocates nothing.
func TestFlusherDeliveryAllocs(t *testing.T) {
	s := newTestServer(t)
	ws, fw := rawWSPair(t)
	if !fw.NonBlocking() {
		t.Fatal("a plain TCP connection is not written without blocking")
	}
	c := &conn{s: s, ws: ws, fw: fw}
	c.cl = fanout.NewClient(4096, 4<<20, func() { t.Error("overflow") })
	subs := c.cl.SubsFor([]string{"1"})
	ev, err := fanout.NewEvent("orders.42", "js:7", []byte(`{"id":42,"status":"paid","pad":"`+strings.Repeat("x", 200)+`"}`))
	if err != nil {
		t.Fatal(err)
	}
	const perRun = 64
	run := func() {
		for range perRun {
			it := fanout.Item{Ev: ev, Subs: subs}
			if _, _, err := c.cl.Mailbox.Push(it, it.Size()); err != nil {
				t.Fatal(err)
			}
		}
		flushBench(t, c)
	}
	for range 10 { // warm the pools
		run()
	}
	if a := ownAllocsPerRun(200, run); a/perRun > 0.01 {
		t.Errorf("%.2f allocations per %d deliveries, want 0", a, perRun)
	}
}

// ownAllocsPerRun is testing.AllocsPerRun's average, the least of five
// measurements. AllocsPerRun counts every goroutine's allocations, and a
// goroutine an earlier test left to end (a client's reconnect loop) can
// allocate during one: a fresh clone's make test once saw 2 allocations
// per run in TestFlusherDeliveryAllocs that way. An allocation of f's own
// shows in every measurement, so the least of them still finds it.
func ownAllocsPerRun(runs int, f func()) float64 {
	least := testing.AllocsPerRun(runs, f)
	for range 4 {
		least = min(least, testing.AllocsPerRun(runs, f))
	}
	return least
}
