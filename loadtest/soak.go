package loadtest

import (
	"context"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"
)

// The soak's schedule, from the first publish. Events flow at Config.Rate
// throughout, so the Clients' writers are busy in every window and the
// gateway allocates, and collects, all along:
//
//	|---- ChurnBaseline ----|------- Churn -------|----- ChurnSettle -----|
//	            [ baseline ]  churners come and go  churners gone [ after ]
//	                          peak ...........................................
//
// The churners leave when Churn ends (a session then open is closed with
// a handshake); "returned" is the first reading after that within
// goroutineSlack of the baseline. Baseline and after are the lowest
// readings over windows of the same length (Config.churnWindow), so
// neither a reading that catches a transient goroutine nor one taken just
// before a GC decides the verdict.

const (
	// sampleEvery is how often the soak reads the gateway's /metrics.
	sampleEvery = 250 * time.Millisecond
	// goroutineSlack is how far above the baseline the after count may
	// be. The lowest reading over a window of a steady gateway is exact:
	// in the soaks of docs/benchmarks.md (9,000–27,000 sessions) after
	// equalled the baseline, and a planted leak of one goroutine per
	// ~500 connections ended 12 over it.
	goroutineSlack = 5
	// Heap in use comes back within heapSlackShare of the baseline plus
	// heapSlackBytes: the heap is read without forcing a collection, so
	// it carries up to a GC cycle's garbage (after was 1.2–1.6 × the
	// baseline in those soaks, the same after 3× the sessions).
	heapSlackShare = 0.5
	heapSlackBytes = 8 << 20
)

// soak runs the churners and reads the gateway's figures around them. It
// runs on a goroutine of Run's; it owns the churners' goroutines and
// waits for them.
type soak struct {
	cfg      *Config        // static
	mr       *metricsReader // static
	churners []*churner     // static; each one's tally is read after its goroutine has exited
	connects atomic.Int64   // sessions so far, for progress
}

func newSoak(cfg *Config, mr *metricsReader) *soak {
	s := &soak{cfg: cfg, mr: mr, churners: make([]*churner, cfg.ChurnClients)}
	for i := range s.churners {
		s.churners[i] = &churner{id: i, cfg: cfg, connects: &s.connects, rng: rand.New(rand.NewPCG(cfg.ChurnSeed, uint64(i)))}
	}
	return s
}

// run follows the schedule from start (the first publish) and returns
// what it measured. sent counts the events the publisher has handed over. When stop ends first it returns at once, with
// Incomplete set. ctx is the caller's (see churner.run).
func (s *soak) run(ctx, stop context.Context, start time.Time, sent *atomic.Int64) *ChurnStats {
	cfg := s.cfg
	cs := &ChurnStats{Duration: cfg.Churn, Clients: cfg.ChurnClients, Seed: cfg.ChurnSeed, GoroutineSlack: goroutineSlack, GoroutinesReturnedIn: -1}
	win := cfg.churnWindow()
	churnAt := start.Add(cfg.ChurnBaseline)

	var base reading
	s.sample(stop, cs, start.Add(cfg.ChurnBaseline-win), churnAt, func(_ time.Time, g gauges) { base.low(g) })
	s.ensure(stop, cs, &base)

	churnCtx, cancel := context.WithDeadline(stop, churnAt.Add(cfg.Churn))
	defer cancel()
	churnStart := time.Now()
	var wg sync.WaitGroup
	for _, ch := range s.churners {
		ch.sent = sent
		wg.Go(func() { ch.run(ctx, churnCtx) })
	}
	var peak reading
	if base.ok {
		peak.high(base.g) // the peak is at least the baseline
	}
	s.sample(churnCtx, cs, churnAt, churnAt.Add(cfg.Churn), func(_ time.Time, g gauges) { peak.high(g) })
	wg.Wait()
	gone := time.Now()
	cs.Elapsed = gone.Sub(churnStart)

	end := start.Add(cfg.churnSpan())
	var after reading
	s.sample(stop, cs, gone, end, func(at time.Time, g gauges) {
		peak.high(g) // the churners' close handshakes end after the window
		if cs.GoroutinesReturnedIn < 0 && base.ok && g.goroutines <= base.g.goroutines+goroutineSlack {
			cs.GoroutinesReturnedIn = at.Sub(gone)
		}
		if !at.Before(end.Add(-win)) {
			after.low(g)
		}
	})
	s.ensure(stop, cs, &after)
	cs.Incomplete = stop.Err() != nil || !base.ok || !after.ok
	cs.fill(base, peak, after, s.churners)
	return cs
}

// sample reads the gauges every sampleEvery from from until until, or
// until done ends, and hands each reading to f with the time it
// completed. A failed read is counted, not fatal: the verdict needs only
// a reading in each window.
func (s *soak) sample(done context.Context, cs *ChurnStats, from, until time.Time, f func(time.Time, gauges)) {
	if d := time.Until(from); d > 0 {
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-done.Done():
			t.Stop()
			return
		}
	}
	tick := time.NewTicker(sampleEvery)
	defer tick.Stop()
	for {
		if time.Now().After(until) {
			return
		}
		if g, err := s.mr.read(done); err != nil {
			cs.metricError(done, err)
		} else {
			f(time.Now(), g)
		}
		select {
		case <-tick.C:
		case <-done.Done():
			return
		}
	}
}

// ensure gives a window that got no reading (on a saturated gateway one
// read can outlast a window) one more, taken now.
func (s *soak) ensure(stop context.Context, cs *ChurnStats, r *reading) {
	if r.ok || stop.Err() != nil {
		return
	}
	g, err := s.mr.read(stop)
	if err != nil {
		cs.metricError(stop, err)
		return
	}
	r.low(g)
}

// reading keeps the lowest or the highest of a window's readings.
type reading struct {
	g  gauges
	ok bool // at least one reading
}

func (r *reading) low(g gauges) {
	if !r.ok {
		r.g, r.ok = g, true
		return
	}
	r.g.goroutines = min(r.g.goroutines, g.goroutines)
	r.g.heapInuse = min(r.g.heapInuse, g.heapInuse)
	r.g.connections, r.g.subscriptions = g.connections, g.subscriptions // state, not noise: the last one
}

func (r *reading) high(g gauges) {
	if !r.ok {
		r.g, r.ok = g, true
		return
	}
	r.g.goroutines = max(r.g.goroutines, g.goroutines)
	r.g.heapInuse = max(r.g.heapInuse, g.heapInuse)
	r.g.connections = max(r.g.connections, g.connections)
	r.g.subscriptions = max(r.g.subscriptions, g.subscriptions)
}
