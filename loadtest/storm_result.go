package loadtest

// writeStorm writes a storm's rows of the result table.
func writeStorm(row func(name, format string, args ...any), s *StormStats) {
	row("storm", "node A stopped after %d events; drained and exited in %s (seed %d)", s.After, roundDur(s.Drain), s.Seed)
	row("storm closes from node A", "%d with 1001, %d otherwise", s.ClosedGoingAway, s.ClosedOther)
	row("storm back on node B", "%d / %d: all %s after SIGTERM (median %s)", s.Back, s.Clients, roundDur(s.AllBack), roundDur(s.BackMedian))
	row("storm caught up", "%d / %d: all %s after SIGTERM (median %s)", s.CaughtUp, s.Clients, roundDur(s.AllCaughtUp), roundDur(s.CaughtUpMedian))
	row("storm dials to node B", "%d: %d refused (503/429), %d failed otherwise", s.Attempts, s.Refusals, s.Failures)
	if s.FirstFailure != "" {
		row("storm first failed dial", "%s", s.FirstFailure)
	}
	if s.NodeSampled {
		row("node B over the storm", "%.2f s cpu in %s, busiest second %.2f cores", s.NodeCPUSeconds, roundDur(s.Window), s.NodePeakCores)
		row("node B rss", "%.1f MiB at SIGTERM, peak %.1f MiB", float64(s.NodeRSSBefore)/(1<<20), float64(s.NodeRSSHighWater)/(1<<20))
	}
}

// stormJSON is a storm's part of the JSON result.
type stormJSON struct {
	OK                   bool     `json:"ok"`
	Clients              int      `json:"clients"`
	After                int      `json:"after_events"`
	Seed                 uint64   `json:"seed"`
	DrainSeconds         float64  `json:"drain_seconds"`
	ClosedGoingAway      int      `json:"closed_going_away"`
	ClosedOther          int      `json:"closed_other"`
	Back                 int      `json:"back"`
	CaughtUp             int      `json:"caught_up"`
	AllBackSeconds       float64  `json:"all_back_seconds"`
	BackMedianSeconds    float64  `json:"back_median_seconds"`
	AllCaughtUpSeconds   float64  `json:"all_caught_up_seconds"`
	CaughtUpMedianSecs   float64  `json:"caught_up_median_seconds"`
	Attempts             int      `json:"attempts"`
	Refusals             int      `json:"refusals"`
	Failures             int      `json:"failures"`
	FirstFailure         string   `json:"first_failure,omitempty"`
	WindowSeconds        float64  `json:"window_seconds"`
	NodeCPUSeconds       *float64 `json:"node_b_cpu_seconds,omitempty"`
	NodePeakCores        *float64 `json:"node_b_peak_cores,omitempty"`
	NodeRSSBeforeBytes   *int64   `json:"node_b_rss_before_bytes,omitempty"`
	NodeRSSHighWaterByte *int64   `json:"node_b_rss_high_water_bytes,omitempty"`
}

func newStormJSON(s *StormStats) *stormJSON {
	j := &stormJSON{
		OK: s.OK(), Clients: s.Clients, After: s.After, Seed: s.Seed,
		DrainSeconds:    s.Drain.Seconds(),
		ClosedGoingAway: s.ClosedGoingAway, ClosedOther: s.ClosedOther,
		Back: s.Back, CaughtUp: s.CaughtUp,
		AllBackSeconds: s.AllBack.Seconds(), BackMedianSeconds: s.BackMedian.Seconds(),
		AllCaughtUpSeconds: s.AllCaughtUp.Seconds(), CaughtUpMedianSecs: s.CaughtUpMedian.Seconds(),
		Attempts: s.Attempts, Refusals: s.Refusals, Failures: s.Failures, FirstFailure: s.FirstFailure,
		WindowSeconds: s.Window.Seconds(),
	}
	if s.NodeSampled {
		j.NodeCPUSeconds, j.NodePeakCores = &s.NodeCPUSeconds, &s.NodePeakCores
		j.NodeRSSBeforeBytes, j.NodeRSSHighWaterByte = &s.NodeRSSBefore, &s.NodeRSSHighWater
	}
	return j
}
