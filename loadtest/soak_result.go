package loadtest

import (
	"context"
	"fmt"
	"time"
)

// ChurnStats is what a churn run (Config.Churn) measured. The Clients'
// deliveries are verified and counted in Result as in any run; these are
// the churners' and the gateway's.
type ChurnStats struct {
	Duration time.Duration // Config.Churn
	Elapsed  time.Duration // from starting the churners until the last one had left
	Clients  int           // churners (Config.ChurnClients)
	Seed     uint64        // Config.ChurnSeed: rerun with it for the same session kinds and lengths

	// Connects counts sessions that connected (and subscribed, but for
	// early drops), by kind in the four that follow.
	Connects, CleanCloses, Drops, Resubscribing, EarlyDrops int64
	Resubscribes                                            int64   // subscription hand-overs within resubscribing sessions
	ConnectsPerSec                                          float64 // Connects / Elapsed
	Delivered                                               int64   // events the churners received
	DeliveriesPerSec                                        float64 // Delivered / Elapsed

	// A session's stream, from its first event on: events skipped,
	// events repeated or out of order, and events listing a subscription
	// before its "subscribed" or after its "unsubscribed".
	Gaps, Duplicates, Misrouted int64
	// LateStarts counts sessions whose first event came after one that
	// was published once their subscribe reply had arrived: events the
	// gateway owed them and lost.
	LateStarts     int64
	FirstViolation string
	// ViolatingSessions counts the sessions with a gap, a repeat or a
	// misrouted event, by kind: clean close, drop, resubscribing, early drop.
	ViolatingSessions [numSessionKinds]int64
	// Errors counts sessions that failed while the window was open: a
	// connect or subscribe that failed, a connection that ended, a server
	// error message.
	Errors     int64
	FirstError string

	// The gateway, from its /metrics: baseline (the lowest reading of the
	// window before churn), peak (the highest from churn start until
	// the end) and after (the lowest of the window at the end).
	Goroutines, Heap, Connections, Subscriptions Gauge
	GoroutineSlack                               int64         // how far above the baseline After.Goroutines may be
	GoroutinesReturnedIn                         time.Duration // from the last churner leaving to the first reading within the slack; negative: never
	HeapLimit                                    int64         // how high Heap.After may be
	HasConnections                               bool          // the gateway exports fanwire_connections and fanwire_subscriptions
	MetricErrors                                 int64         // failed reads of /metrics
	FirstMetricError                             string
	Incomplete                                   bool // the run stopped before the schedule ended, or a window had no reading
}

// Gauge is one of the gateway's figures around the churn.
type Gauge struct {
	Baseline int64 `json:"baseline"`
	Peak     int64 `json:"peak"`
	After    int64 `json:"after"`
}

// GoroutinesOK reports whether the gateway's goroutines came back to the
// baseline, within GoroutineSlack.
func (c *ChurnStats) GoroutinesOK() bool {
	return !c.Incomplete && c.Goroutines.After <= c.Goroutines.Baseline+c.GoroutineSlack
}

// HeapOK reports whether the gateway's heap in use came back under HeapLimit.
func (c *ChurnStats) HeapOK() bool { return !c.Incomplete && c.Heap.After <= c.HeapLimit }

// ConnectionsOK reports whether the gateway's connection and subscription
// gauges came back exactly to the baseline (true when it exports none).
func (c *ChurnStats) ConnectionsOK() bool {
	return !c.HasConnections || (c.Connections.After == c.Connections.Baseline && c.Subscriptions.After == c.Subscriptions.Baseline)
}

// OK reports whether churn happened, every churner's stream was clean,
// no session failed, and the gateway came back to its baseline.
func (c *ChurnStats) OK() bool {
	return c.Connects > 0 && c.Gaps == 0 && c.Duplicates == 0 && c.Misrouted == 0 && c.LateStarts == 0 && c.Errors == 0 &&
		c.GoroutinesOK() && c.HeapOK() && c.ConnectionsOK()
}

// Problem names what makes OK false, "" when it is true.
func (c *ChurnStats) Problem() string {
	switch {
	case c.Incomplete:
		if c.FirstMetricError != "" {
			return "incomplete: " + c.FirstMetricError
		}
		return "incomplete: the run stopped before the churn schedule ended"
	case c.Connects == 0:
		return "no churn session connected"
	case !c.GoroutinesOK():
		return fmt.Sprintf("goroutine leak: %d after, baseline %d (+%d allowed)", c.Goroutines.After, c.Goroutines.Baseline, c.GoroutineSlack)
	case !c.HeapOK():
		return fmt.Sprintf("heap not back: %s after, baseline %s (limit %s)", mib(c.Heap.After), mib(c.Heap.Baseline), mib(c.HeapLimit))
	case !c.ConnectionsOK():
		return fmt.Sprintf("gateway gauges not back: connections %d after, %d before; subscriptions %d after, %d before",
			c.Connections.After, c.Connections.Baseline, c.Subscriptions.After, c.Subscriptions.Baseline)
	case c.Gaps+c.Duplicates+c.Misrouted+c.LateStarts > 0:
		return "churn stream: " + c.FirstViolation
	case c.Errors > 0:
		return "churn session failed: " + c.FirstError
	}
	return ""
}

// fill sums the churners' tallies (their goroutines have exited) and
// sets the gateway's figures.
func (c *ChurnStats) fill(base, peak, after reading, churners []*churner) {
	for _, ch := range churners {
		t := &ch.t
		c.CleanCloses += t.sessions[sessionClean]
		c.Drops += t.sessions[sessionDrop]
		c.Resubscribing += t.sessions[sessionResub]
		c.EarlyDrops += t.sessions[sessionEarly]
		c.Resubscribes += t.resubscribes
		c.Delivered += t.delivered
		c.Gaps += t.gaps
		c.Duplicates += t.dups
		c.Misrouted += t.misrouted
		c.LateStarts += t.late
		if c.FirstViolation == "" {
			c.FirstViolation = t.violation
		}
		for k, n := range t.violating {
			c.ViolatingSessions[k] += n
		}
		c.Errors += t.errors
		if c.FirstError == "" {
			c.FirstError = t.firstError
		}
	}
	c.Connects = c.CleanCloses + c.Drops + c.Resubscribing + c.EarlyDrops
	if s := c.Elapsed.Seconds(); s > 0 {
		c.ConnectsPerSec = float64(c.Connects) / s
		c.DeliveriesPerSec = float64(c.Delivered) / s
	}
	c.Goroutines = Gauge{base.g.goroutines, peak.g.goroutines, after.g.goroutines}
	c.Heap = Gauge{base.g.heapInuse, peak.g.heapInuse, after.g.heapInuse}
	c.HeapLimit = int64(float64(base.g.heapInuse)*(1+heapSlackShare)) + heapSlackBytes
	c.HasConnections = base.g.hasConns && base.g.hasSubs
	c.Connections = Gauge{base.g.connections, peak.g.connections, after.g.connections}
	c.Subscriptions = Gauge{base.g.subscriptions, peak.g.subscriptions, after.g.subscriptions}
}

// metricError counts a failed read of /metrics, unless done ended it.
func (c *ChurnStats) metricError(done context.Context, err error) {
	if done.Err() != nil {
		return
	}
	c.MetricErrors++
	if c.FirstMetricError == "" {
		c.FirstMetricError = err.Error()
	}
}

func mib(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }

// writeChurn adds a churn run's rows to Result.WriteTable's table.
func writeChurn(row func(name, format string, args ...any), c *ChurnStats) {
	row("churn", "%s × %d clients (seed %d), churned for %s", c.Duration, c.Clients, c.Seed, roundDur(c.Elapsed))
	row("churn connects", "%d (%.1f/s): %d clean close, %d drop, %d resubscribing (%d hand-overs), %d early drop",
		c.Connects, c.ConnectsPerSec, c.CleanCloses, c.Drops, c.Resubscribing, c.Resubscribes, c.EarlyDrops)
	row("churn deliveries", "%d (%s/s)", c.Delivered, siRate(c.DeliveriesPerSec))
	row("churn gaps / dups / misrouted / late", "%d / %d / %d / %d", c.Gaps, c.Duplicates, c.Misrouted, c.LateStarts)
	if c.FirstViolation != "" {
		v := c.ViolatingSessions
		row("churn violating sessions", "%d clean close, %d drop, %d resubscribing, %d early drop; first: %s",
			v[sessionClean], v[sessionDrop], v[sessionResub], v[sessionEarly], c.FirstViolation)
	}
	row("churn session errors", "%d", c.Errors)
	if c.FirstError != "" {
		row("churn first error", "%s", c.FirstError)
	}
	back := "not within the slack"
	if c.GoroutinesReturnedIn >= 0 {
		back = "within the slack " + roundDur(c.GoroutinesReturnedIn).String() + " after the churners left, read every " + sampleEvery.String()
	}
	row("gateway goroutines", "baseline %d, peak %d, after %d (slack +%d; %s)",
		c.Goroutines.Baseline, c.Goroutines.Peak, c.Goroutines.After, c.GoroutineSlack, back)
	row("gateway heap in use", "baseline %s, peak %s, after %s (limit %s)", mib(c.Heap.Baseline), mib(c.Heap.Peak), mib(c.Heap.After), mib(c.HeapLimit))
	if c.HasConnections {
		row("gateway connections / subs", "baseline %d / %d, peak %d / %d, after %d / %d",
			c.Connections.Baseline, c.Subscriptions.Baseline, c.Connections.Peak, c.Subscriptions.Peak, c.Connections.After, c.Subscriptions.After)
	}
	if c.MetricErrors > 0 {
		row("metrics read errors", "%d, first: %s", c.MetricErrors, c.FirstMetricError)
	}
}

// churnJSON fixes the JSON names of a churn run's figures.
type churnJSON struct {
	OK                     bool    `json:"ok"`
	Problem                string  `json:"problem,omitempty"`
	Seconds                float64 `json:"seconds"`
	ElapsedSeconds         float64 `json:"elapsed_seconds"`
	Clients                int     `json:"clients"`
	Seed                   uint64  `json:"seed"`
	Connects               int64   `json:"connects"`
	CleanCloses            int64   `json:"clean_closes"`
	Drops                  int64   `json:"drops"`
	Resubscribing          int64   `json:"resubscribing"`
	Resubscribes           int64   `json:"resubscribes"`
	EarlyDrops             int64   `json:"early_drops"`
	ConnectsPerSec         float64 `json:"connects_per_sec"`
	Delivered              int64   `json:"delivered"`
	DeliveriesPerSec       float64 `json:"deliveries_per_sec"`
	Gaps                   int64   `json:"gaps"`
	Duplicates             int64   `json:"duplicates"`
	Misrouted              int64   `json:"misrouted"`
	LateStarts             int64   `json:"late_starts"`
	FirstViolation         string  `json:"first_violation,omitempty"`
	ViolatingSessions      []int64 `json:"violating_sessions,omitempty"` // clean close, drop, resubscribing, early drop
	Errors                 int64   `json:"errors"`
	FirstError             string  `json:"first_error,omitempty"`
	Goroutines             Gauge   `json:"goroutines"`
	GoroutineSlack         int64   `json:"goroutine_slack"`
	GoroutinesReturnedSecs float64 `json:"goroutines_returned_seconds"` // -1: never
	HeapInuseBytes         Gauge   `json:"heap_inuse_bytes"`
	HeapLimitBytes         int64   `json:"heap_limit_bytes"`
	Connections            *Gauge  `json:"connections,omitempty"`
	Subscriptions          *Gauge  `json:"subscriptions,omitempty"`
	MetricErrors           int64   `json:"metric_errors"`
	Incomplete             bool    `json:"incomplete"`
}

func newChurnJSON(c *ChurnStats) *churnJSON {
	j := &churnJSON{
		OK: c.OK(), Problem: c.Problem(), Seconds: c.Duration.Seconds(), ElapsedSeconds: c.Elapsed.Seconds(),
		Clients: c.Clients, Seed: c.Seed,
		Connects: c.Connects, CleanCloses: c.CleanCloses, Drops: c.Drops, Resubscribing: c.Resubscribing,
		Resubscribes: c.Resubscribes, EarlyDrops: c.EarlyDrops, ConnectsPerSec: c.ConnectsPerSec,
		Delivered: c.Delivered, DeliveriesPerSec: c.DeliveriesPerSec,
		Gaps: c.Gaps, Duplicates: c.Duplicates, Misrouted: c.Misrouted, LateStarts: c.LateStarts, FirstViolation: c.FirstViolation,
		Errors: c.Errors, FirstError: c.FirstError,
		Goroutines: c.Goroutines, GoroutineSlack: c.GoroutineSlack, GoroutinesReturnedSecs: -1,
		HeapInuseBytes: c.Heap, HeapLimitBytes: c.HeapLimit,
		MetricErrors: c.MetricErrors, Incomplete: c.Incomplete,
	}
	if c.FirstViolation != "" {
		j.ViolatingSessions = c.ViolatingSessions[:]
	}
	if c.GoroutinesReturnedIn >= 0 {
		j.GoroutinesReturnedSecs = c.GoroutinesReturnedIn.Seconds()
	}
	if c.HasConnections {
		j.Connections, j.Subscriptions = &c.Connections, &c.Subscriptions
	}
	return j
}
