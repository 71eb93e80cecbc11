package gateway

import (
	"fmt"
	"testing"
	"time"
)

// BenchmarkDispatch queues one event to 10,000 subscribed clients' mailboxes
// per iteration. ns/delivery and allocs/op are what the targets name
// (≤ 25 ns and 0 allocs per delivery). Mailboxes are drained every
// segItems events outside the timer, as the writers do between the
// dispatcher's batches (≤ 256 events), so a mailbox recycles one segment.
// (A period one off, 129 with 128-item segments, leaves every mailbox a
// segment with one item per drain: about twice the cost per delivery.)
func BenchmarkDispatch(b *testing.B) {
	const drainEvery = segItems
	for _, conns := range []int{10_000} {
		b.Run(fmt.Sprintf("conns=%d", conns), func(b *testing.B) {
			h, evs, drain := dispatchBench(b, conns, "bench.*")
			for range 3 { // warm the segment pool
				for range drainEvery {
					h.dispatch(evs, time.Time{})
				}
				drain()
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				if i%drainEvery == drainEvery-1 {
					b.StopTimer()
					drain()
					b.StartTimer()
				}
				h.dispatch(evs, time.Time{})
			}
			b.StopTimer()
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*conns), "ns/delivery")
		})
	}
}

// BenchmarkDispatchUnderChurn is BenchmarkDispatch with overlapping
// subscriptions (each client on bench.* and bench.hot, so every event's
// deliveries come from the merge cache) while other clients of the node
// subscribe and unsubscribe elsewhere between events, as connections come
// and go. The churn runs outside the timer: allocs/op is the dispatch's
// alone, which should stay 0 when unrelated changes keep the merge cached.
func BenchmarkDispatchUnderChurn(b *testing.B) {
	const drainEvery = segItems // as BenchmarkDispatch
	const churners = 100
	for _, conns := range []int{10_000} {
		b.Run(fmt.Sprintf("conns=%d", conns), func(b *testing.B) {
			h, evs, drain := dispatchBench(b, conns, "bench.*", "bench.hot")
			others := make([]*client, churners)
			for i := range others {
				others[i] = newClient(4096, 4<<20, func() { b.Fatal("overflow") })
			}
			subscribed := make([]bool, churners)
			churn := func(i int) {
				j := i % churners
				p := fmt.Sprintf("churn.%d", j)
				if subscribed[j] {
					h.idx.remove(others[j], "c", p)
				} else {
					h.idx.add(others[j], "c", p)
				}
				subscribed[j] = !subscribed[j]
			}
			for i := range 3 { // warm the segment pool
				for range drainEvery {
					churn(i)
					h.dispatch(evs, time.Time{})
				}
				drain()
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				b.StopTimer()
				if i%drainEvery == drainEvery-1 {
					drain()
				}
				churn(i)
				b.StartTimer()
				h.dispatch(evs, time.Time{})
			}
			b.StopTimer()
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*conns), "ns/delivery")
		})
	}
}

// dispatchBench is the set-up of the dispatch benchmarks: a hub with conns
// clients, each subscribed to patterns (ids s1, s2, ...), one event on
// bench.hot, and drain, which empties every client's mailbox.
func dispatchBench(b *testing.B, conns int, patterns ...string) (h *hub, evs []*Event, drain func()) {
	h = newHub(nil, 0)
	clients := make([]*client, conns)
	for i := range clients {
		clients[i] = newClient(4096, 4<<20, func() { b.Fatal("overflow") })
		for j, p := range patterns {
			h.idx.add(clients[i], fmt.Sprintf("s%d", j+1), p)
		}
	}
	ev, err := NewEvent("bench.hot", "", []byte(`{"seq":1}`))
	if err != nil {
		b.Fatal(err)
	}
	drain = func() {
		for _, c := range clients {
			bt := c.mb.take()
			bt.release()
		}
	}
	return h, []*Event{ev}, drain
}
