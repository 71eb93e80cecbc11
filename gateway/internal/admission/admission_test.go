package admission

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// TestAdmissionFIFO: waiters are admitted one per token in arrival order;
// those that leave (anywhere in the queue, the head included) are skipped
// without losing a token, and the queue gauge returns to zero.
func TestAdmissionFIFO(t *testing.T) {
	a := New(Config{Rate: 10, Burst: 1, Queue: 100, QueueWait: time.Hour, Queued: prometheus.NewGauge(prometheus.GaugeOpts{Name: "q"}), Waited: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "w"})})
	clk := NewManualClock()
	a.SetClock(clk)
	if _, err := a.Wait(context.Background()); err != nil {
		t.Fatalf("the burst's token: %v", err)
	}
	const n = 30
	leaves := map[int]bool{0: true, 7: true, 8: true, 29: true}
	var wg sync.WaitGroup
	order := make(chan int, n)
	cancels := make([]context.CancelFunc, n)
	for i := range n {
		ctx, cancel := context.WithCancel(context.Background())
		cancels[i] = cancel
		wg.Go(func() {
			_, err := a.Wait(ctx)
			switch {
			case err == nil:
				order <- i
			case leaves[i] && errors.Is(err, context.Canceled):
			default:
				t.Errorf("waiter %d: %v", i, err)
			}
		})
		untilQueued(t, a, i+1) // in line before the next comes: the order is the test's
	}
	for i := range leaves {
		cancels[i]()
	}
	untilQueued(t, a, n-len(leaves))
	for i := range n {
		if leaves[i] {
			continue
		}
		clk.Advance(100 * time.Millisecond) // one token at 10/s
		if got := <-order; got != i {
			t.Fatalf("admitted waiter %d, want %d", got, i)
		}
	}
	wg.Wait()
	for _, c := range cancels {
		c()
	}
	if g := queued(a); g != 0 {
		t.Fatalf("%d still queued", g)
	}
}

func untilQueued(t *testing.T, a *Admission, n int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); queued(a) != n; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d queued, want %d", queued(a), n)
		}
	}
}

func queued(a *Admission) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.n
}

// BenchmarkAdmissionFree: an upgrade's way through the admission when a
// token is free (the common case), from concurrent handlers.
func BenchmarkAdmissionFree(b *testing.B) {
	a := New(Config{Rate: 1 << 30, Burst: 1 << 30, Queue: 1, QueueWait: time.Second, Queued: prometheus.NewGauge(prometheus.GaugeOpts{Name: "q"}), Waited: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "w"})})
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := a.Wait(context.Background()); err != nil {
				b.Fatal(err)
			}
		}
	})
}
