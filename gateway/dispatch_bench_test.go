package gateway

import (
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/fanwire/fanwire/gateway/internal/fanout"
	"github.com/fanwire/fanwire/gateway/internal/filter"
	"github.com/fanwire/fanwire/gateway/internal/flush"
)

// BenchmarkDispatch queues one event to 10,000 subscribed clients' mailboxes
// per iteration. ns/delivery and allocs/op are what the targets name
// (≤ 25 ns and 0 allocs per delivery). Mailboxes are drained every
// fanout.SegmentItems events outside the timer, as the writers do between the
// dispatcher's batches (≤ 256 events), so a mailbox recycles one segment.
// (A period one off, 129 with 128-item segments, leaves every mailbox a
// segment with one item per drain: about twice the cost per delivery.)
func BenchmarkDispatch(b *testing.B) {
	const drainEvery = fanout.SegmentItems
	for _, conns := range []int{10_000} {
		b.Run(fmt.Sprintf("conns=%d", conns), func(b *testing.B) {
			h, evs, drain := dispatchBench(b, conns, "bench.*")
			for range 3 { // warm the segment pool
				for range drainEvery {
					h.Dispatch(evs, "", time.Time{})
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
				h.Dispatch(evs, "", time.Time{})
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
	const drainEvery = fanout.SegmentItems // as BenchmarkDispatch
	const churners = 100
	for _, conns := range []int{10_000} {
		b.Run(fmt.Sprintf("conns=%d", conns), func(b *testing.B) {
			h, evs, drain := dispatchBench(b, conns, "bench.*", "bench.hot")
			others := make([]*fanout.Client, churners)
			for i := range others {
				others[i] = fanout.NewClient(4096, 4<<20, func() { b.Fatal("overflow") })
			}
			subscribed := make([]bool, churners)
			churn := func(i int) {
				j := i % churners
				p := fmt.Sprintf("churn.%d", j)
				if subscribed[j] {
					h.Unsubscribe(others[j], "c", p, nil)
				} else {
					h.Subscribe(others[j], "c", p, nil)
				}
				subscribed[j] = !subscribed[j]
			}
			for i := range 3 { // warm the segment pool
				for range drainEvery {
					churn(i)
					h.Dispatch(evs, "", time.Time{})
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
				h.Dispatch(evs, "", time.Time{})
			}
			b.StopTimer()
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*conns), "ns/delivery")
		})
	}
}

// dispatchBench is the set-up of the dispatch benchmarks: a hub with conns
// clients, each subscribed to patterns (ids s1, s2, ...), one event on
// bench.hot, and drain, which empties every client's mailbox.
func dispatchBench(b *testing.B, conns int, patterns ...string) (h *fanout.Hub, evs []*fanout.Event, drain func()) {
	h = fanout.NewHub(fanout.HubConfig{Wakes: flush.New(runtime.GOMAXPROCS(0))})
	clients := make([]*fanout.Client, conns)
	for i := range clients {
		clients[i] = fanout.NewClient(4096, 4<<20, func() { b.Fatal("overflow") })
		for j, p := range patterns {
			h.Subscribe(clients[i], fmt.Sprintf("s%d", j+1), p, nil)
		}
	}
	ev, err := fanout.NewEvent("bench.hot", "", []byte(`{"seq":1}`))
	if err != nil {
		b.Fatal(err)
	}
	drain = func() {
		for _, c := range clients {
			bt := c.Mailbox.Take()
			bt.Release()
		}
	}
	return h, []*fanout.Event{ev}, drain
}

// BenchmarkDispatchViews dispatches events to filtered subscriptions, one
// per client, per event: equality filters on a field (each client its own
// customer: indexed, so an event reaches only its own) at 10 and 10,000
// clients, and range filters (scanned: every filter evaluated once per
// event) at 1,000. Each event matches exactly one client. ns/op is the
// cost of one event, parse included; the issue asks that 10,000 equality
// views cost within 2× of 10.
func BenchmarkDispatchViews(b *testing.B) {
	for _, tc := range []struct {
		name  string
		conns int
		where func(i int) string
	}{
		{"eq/conns=10", 10, func(i int) string { return fmt.Sprintf("doc.customer_id == %d", i) }},
		{"eq/conns=10000", 10_000, func(i int) string { return fmt.Sprintf("doc.customer_id == %d", i) }},
		{"range/conns=1000", 1000, func(i int) string {
			return fmt.Sprintf("doc.total >= %d.0 && doc.total < %d.0", i, i+1)
		}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			ec := filter.NewCache(10_000, nil)
			h := fanout.NewHub(fanout.HubConfig{MaxPace: time.Millisecond, Wakes: flush.New(runtime.GOMAXPROCS(0))})
			clients := make([]*fanout.Client, tc.conns)
			for i := range clients {
				clients[i] = fanout.NewClient(1<<20, 1<<30, func() { b.Fatal("overflow") })
				ce, err := ec.Compile(tc.where(i))
				if err != nil {
					b.Fatal(err)
				}
				vs := &fanout.View{Client: clients[i], ID: "v", Pattern: "db.orders.*", Filter: filter.New(nil, ce, nil),
					Subs: fanout.EncodeSubsList([]string{"v"}), Max: 1 << 20, Held: map[string]struct{}{}, OnEnd: func(string) {}}
				h.Locked(func(tx fanout.Tx) bool { tx.AddView(vs); return true })
			}
			const nev = 1024
			evs := make([][]*fanout.Event, nev)
			for k := range nev {
				c := k % tc.conns
				data := fmt.Sprintf(`{"op":"update","key":%d,"doc":{"id":%d,"customer_id":%d,"total":%d.5,"status":"open","note":"some text to parse"}}`, k, k, c, c)
				ev, err := fanout.NewEvent(fmt.Sprintf("db.orders.%d", k), "", []byte(data))
				if err != nil {
					b.Fatal(err)
				}
				evs[k] = []*fanout.Event{ev}
			}
			drain := func() {
				for _, c := range clients {
					bt := c.Mailbox.Take()
					bt.Release()
				}
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				k := i % nev
				if k == 0 && i > 0 {
					b.StopTimer()
					drain()
					for _, l := range evs { // parse again, as a new event would be
						l[0] = mustEvent(b, l[0])
					}
					b.StartTimer()
				}
				h.Dispatch(evs[k], "", time.Time{})
			}
		})
	}
}

func mustEvent(b *testing.B, ev *fanout.Event) *fanout.Event {
	e, err := fanout.NewEvent(ev.Subject, ev.Cursor, ev.Data())
	if err != nil {
		b.Fatal(err)
	}
	return e
}
