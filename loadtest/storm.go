package loadtest

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// A reconnect storm (Config.StormURL) is what a rolling restart does to a
// node's clients: every client connects to node A; once StormAfter events
// are published, node A is stopped as SIGTERM stops it (it drains and
// closes every connection with 1001); each client then comes back on node
// B, on the same durable broker, after fanwire.js's backoff (backoff.go),
// retrying through B's 503s and 429s, and resumes from the cursor of the
// last event it processed, while events keep flowing. Every client is
// verified as in any run: every event once, in order. The storm goroutine
// measures node B meanwhile: its CPU and RSS from /proc (Config.Proc).

// stormSampleEvery is how often node B's /proc is read while the storm
// runs: ten readings per second give its busiest second to 10%.
const stormSampleEvery = 100 * time.Millisecond

// storm is a run's reconnect storm. The storm goroutine (run) owns it; the
// counters are bumped by the clients' readers.
type storm struct {
	cfg     *Config // static
	node    *Config // static: cfg with URL node B's, for the clients' dials
	clients int     // static

	back   atomic.Int64 // clients subscribed again on node B
	caught atomic.Int64 // clients caught up on node B
}

// newStorm prepares the storm of a run and gives each client its part.
func newStorm(cfg *Config, clients []*client, sent *atomic.Int64) *storm {
	node := *cfg
	node.URL = cfg.StormURL
	s := &storm{cfg: cfg, node: &node, clients: len(clients)}
	now := time.Now()
	for _, c := range clients {
		c.rc = &reconnector{cfg: cfg, sent: sent, cursor: c.subCursor}
		c.rc.st = newStormClient(s, c.id, now)
	}
	return s
}

// StormStats is what a reconnect storm (Config.StormURL) measured. Times
// run from the moment node A was told to stop (SIGTERM).
type StormStats struct {
	Clients int
	After   int    // events published before node A was stopped
	Seed    uint64 // Config.StormSeed: the backoff jitter's draws

	// Drain is node A's: from SIGTERM until the process had exited
	// (Config.StormStop returned).
	Drain time.Duration
	// ClosedGoingAway counts clients whose connection to node A ended
	// with 1001 (going away); ClosedOther those it ended otherwise
	// (dropped at the drain's deadline, a 4008 before it).
	ClosedGoingAway, ClosedOther int

	// Back counts clients subscribed again on node B, CaughtUp those that
	// then held every event published until they were back (the events
	// they missed, replayed from their cursors). AllBack
	// and AllCaughtUp are when the last one was; the medians are over
	// the clients that were.
	Back, CaughtUp                  int
	AllBack, AllCaughtUp            time.Duration
	BackMedian, CaughtUpMedian      time.Duration
	Attempts, Refusals, Failures    int // dials to node B; upgrades answered 503/429; other failed dials and handshakes
	FirstFailure                    string
	NodeSampled                     bool          // Config.Proc names node B
	Window                          time.Duration // the measured window: SIGTERM → every client caught up (or the run's end)
	NodeCPUSeconds                  float64       // node B's CPU over Window
	NodePeakCores                   float64       // node B's busiest second in Window, in cores
	NodeRSSBefore, NodeRSSHighWater int64         // node B's RSS at SIGTERM, and its peak (VmHWM) at the end of Window
}

// stormRun is what the storm goroutine hands back.
type stormRun struct {
	stats *StormStats // nil when the run ended before node A was stopped
	at    time.Time   // when node A was told to stop
	err   error
}

// run waits until cfg.StormAfter events are published, stops node A, and
// samples node B until every client has caught up on it, or until
// sampling ends (the run is over). It returns once node A's StormStop has
// returned: ctx, the caller's, bounds that, not sampling.
func (s *storm) run(ctx, sampling context.Context, sent *atomic.Int64) stormRun {
	tick := time.NewTicker(time.Millisecond)
	for sent.Load() < int64(s.cfg.StormAfter) {
		select {
		case <-tick.C:
		case <-sampling.Done():
			tick.Stop()
			return stormRun{}
		}
	}
	tick.Stop()
	st := &StormStats{Clients: s.clients, After: int(sent.Load()), Seed: s.cfg.StormSeed, NodeSampled: s.cfg.Proc.Enabled()}
	var samples []nodeSample
	if st.NodeSampled {
		first, err := sampleNode(s.cfg.Proc, time.Now())
		if err != nil {
			return stormRun{err: err}
		}
		samples = append(samples, first)
		st.NodeRSSBefore = first.rss
	}
	at := time.Now()
	var wg sync.WaitGroup
	drained := make(chan error, 1)
	wg.Go(func() {
		err := s.cfg.StormStop(ctx)
		st.Drain = time.Since(at) // read after wg.Wait
		drained <- err
	})
	var stopErr error
	stopped := false
	tick = time.NewTicker(stormSampleEvery)
	defer tick.Stop()
	for !stopped || s.caught.Load() < int64(s.clients) {
		select {
		case stopErr = <-drained:
			stopped = true
		case <-tick.C:
			if st.NodeSampled {
				// Stamped when read, not when the tick was due: a busy
				// machine delays the read, and the tick's time then
				// makes the CPU rate too high.
				ns, err := sampleNode(s.cfg.Proc, time.Now())
				if err != nil {
					wg.Wait()
					return stormRun{err: err}
				}
				samples = append(samples, ns)
			}
			continue
		case <-sampling.Done():
		}
		if sampling.Err() != nil {
			break
		}
	}
	end := time.Now()
	st.Window = end.Sub(at)
	if st.NodeSampled {
		last, err := sampleNode(s.cfg.Proc, end)
		if err != nil {
			wg.Wait()
			return stormRun{err: err}
		}
		samples = append(samples, last)
		st.NodeCPUSeconds = last.cpu - samples[0].cpu
		st.NodePeakCores = peakCores(samples)
		st.NodeRSSHighWater = last.hwm
	}
	wg.Wait()
	if !stopped {
		stopErr = <-drained
	}
	if stopErr != nil {
		return stormRun{err: fmt.Errorf("storm: stop node A: %w", stopErr)}
	}
	return stormRun{stats: st, at: at}
}

// nodeSample is one reading of node B.
type nodeSample struct {
	at       time.Time
	cpu      float64 // seconds
	rss, hwm int64
}

func sampleNode(p ProcSampler, at time.Time) (nodeSample, error) {
	ps, err := p.Sample()
	if err != nil {
		return nodeSample{}, fmt.Errorf("storm: sample node B: %w", err)
	}
	rss, err := p.RSS()
	if err != nil {
		return nodeSample{}, fmt.Errorf("storm: sample node B: %w", err)
	}
	return nodeSample{at: at, cpu: ps.CPUSeconds, rss: rss, hwm: ps.RSSHighWaterBytes}, nil
}

// peakCores is the highest CPU rate between two samples at least a second
// apart (for each sample, the latest earlier one that is), in cores; over
// a window shorter than a second, the window's. Shorter spans would be
// noise: CPU time comes in 10 ms ticks.
func peakCores(samples []nodeSample) float64 {
	if len(samples) < 2 {
		return 0
	}
	first, last := samples[0], samples[len(samples)-1]
	if d := last.at.Sub(first.at); d < time.Second {
		return (last.cpu - first.cpu) / max(d.Seconds(), 1e-9)
	}
	var peak float64
	j := -1 // the latest sample at least a second before samples[i]
	for i := 1; i < len(samples); i++ {
		for j+1 < i && samples[i].at.Sub(samples[j+1].at) >= time.Second {
			j++
		}
		if j >= 0 {
			peak = max(peak, (samples[i].cpu-samples[j].cpu)/samples[i].at.Sub(samples[j].at).Seconds())
		}
	}
	return peak
}

// collectStorm adds the clients' storm tallies to the storm goroutine's
// figures; nil when node A was never stopped.
func collectStorm(sr stormRun, clients []*client) *StormStats {
	st := sr.stats
	if st == nil {
		return nil
	}
	at := sr.at.UnixNano()
	var back, caught []time.Duration
	for _, c := range clients {
		s := c.rc.st
		switch {
		case s.left == 0:
		case s.closeCode == 1001:
			st.ClosedGoingAway++
		default:
			st.ClosedOther++
		}
		if s.back != 0 {
			back = append(back, time.Duration(max(0, s.back-at)))
		}
		if s.caught != 0 {
			caught = append(caught, time.Duration(max(0, s.caught-at)))
		}
		st.Attempts += s.attempts
		st.Refusals += s.refusals
		st.Failures += s.failures
		if st.FirstFailure == "" {
			st.FirstFailure = s.firstFailure
		}
	}
	st.Back, st.CaughtUp = len(back), len(caught)
	st.BackMedian, st.AllBack = medianMax(back)
	st.CaughtUpMedian, st.AllCaughtUp = medianMax(caught)
	return st
}

// medianMax returns the median and the largest of ds (zeros when empty);
// it sorts ds.
func medianMax(ds []time.Duration) (median, largest time.Duration) {
	if len(ds) == 0 {
		return 0, 0
	}
	slices.Sort(ds)
	return ds[len(ds)/2], ds[len(ds)-1]
}

// OK reports whether every client came back on node B and caught up.
func (s *StormStats) OK() bool { return s.Back == s.Clients && s.CaughtUp == s.Clients }
