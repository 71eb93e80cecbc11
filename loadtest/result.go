package loadtest

import (
	"time"
)

// Result is what one run measured. Counts are exact; latencies come from a
// histogram whose buckets are at most 6.25% wide (LatencyMax is exact).
type Result struct {
	// The run as configured (after defaults).
	Clients, Events, Size, Rate int
	Subject                     string

	// PublishVia is who published (Config.PublishVia): "broker", or
	// "ws"/"http", where every client published Events of its own.
	PublishVia string

	// Delivery. Expected = Clients × Events (× Clients when the clients
	// publish); every count is summed over clients.
	Expected   int64
	Delivered  int64 // every event received, duplicates included
	Gaps       int64 // events skipped over when a later one arrived first
	Duplicates int64 // events received again after their first arrival
	OutOfOrder int64 // events whose first arrival came after a later one
	Missing    int64 // events never received
	Unexpected int64 // events whose seq is outside 1..Events
	Malformed  int64 // messages without a type, or events without seq/ts
	Leaves     int64 // leave messages: in no run does a document leave a view, so any is wrong
	// ServerErrors counts {"type":"error"} messages after subscribing.
	ServerErrors     int64
	FirstServerError string // the first such message, verbatim
	// Disconnects counts clients whose connection ended before the run did.
	Disconnects     int
	FirstDisconnect string
	TimedOut        bool // stopped after Config.Timeout without delivery progress
	// Where and WhereDocs are a view run's (Config.Where): each event
	// went to exactly one client, so Expected is Events.
	Where     string
	WhereDocs int
	// Resume is set when clients dropped and resumed (Config.ResumeShare);
	// their deliveries are in the counts above, verified like everyone's.
	Resume *ResumeStats
	// Churn is set for a churn run (Config.Churn): the churners' sessions
	// and the gateway's goroutines and heap around them. Its OK is part
	// of Result.OK.
	Churn *ChurnStats
	// Storm is set for a reconnect storm (Config.StormURL) once node A
	// was stopped: its drain, the clients' way back to node B and node
	// B's figures. Its OK (every client back and caught up) is part of
	// Result.OK; the gateway figures below are node B's.
	Storm *StormStats

	// Timing. Elapsed runs from the first publish to the last delivery.
	Elapsed          time.Duration
	PublishElapsed   time.Duration // publishing plus the final flush; 0 if it had not finished
	DeliveriesPerSec float64       // Delivered / Elapsed
	// Client publishes (PublishVia ws or http): how many the gateway
	// accepted ("published" replies, 200 answers), and their rate from
	// the first publish to the last acceptance (then PublishElapsed).
	PublishesAccepted int64
	PublishesPerSec   float64
	LatencyP50        time.Duration // publish to receipt of the frame carrying the event
	LatencyP95        time.Duration
	LatencyP99        time.Duration
	LatencyMax        time.Duration
	LatencyMean       time.Duration

	// Cost, between the first publish and the end of delivery. The gateway
	// figures are set only when Config.Proc names a process.
	GatewaySampled           bool
	GatewayCPUSeconds        float64
	GatewayRSSHighWaterBytes int64   // VmHWM: the gateway's peak RSS over its whole life, not just this run
	CPUPerDeliveryMicros     float64 // GatewayCPUSeconds per delivered event, in µs
	CPUPerEventMicros        float64 // GatewayCPUSeconds per published event (Events, or Clients × Events when the clients publish), in µs
	LoadtestCPUSeconds       float64 // this process's CPU over the same window (it shares the machine)
}

// OK reports whether every client received every event exactly once, in
// order, and nothing else went wrong on the wire; in a churn run, also
// whether the churn was clean and the gateway came back to its baseline
// (ChurnStats.OK); in a storm, whether every client came back on node B
// and caught up (StormStats.OK).
func (r *Result) OK() bool {
	return r.Gaps == 0 && r.Duplicates == 0 && r.OutOfOrder == 0 && r.Missing == 0 &&
		r.Unexpected == 0 && r.Malformed == 0 && r.Leaves == 0 && r.ServerErrors == 0 && (r.Churn == nil || r.Churn.OK()) &&
		(r.Storm == nil || r.Storm.OK())
}

// collect sums the clients' tallies once their readers have exited.
func collect(cfg *Config, clients []*client, m *monitor, before, after usage) *Result {
	r := &Result{
		Clients: cfg.Clients, Events: cfg.Events, Size: cfg.Size, Rate: cfg.Rate, Subject: cfg.Subject,
		PublishVia:     cfg.PublishVia,
		Where:          cfg.Where,
		WhereDocs:      cfg.WhereDocs,
		Expected:       cfg.expectedTotal(),
		TimedOut:       m.timedOut,
		PublishElapsed: m.published,
		Resume:         collectResume(cfg, clients),
	}
	var lat histogram
	var last int64
	for _, c := range clients {
		r.Delivered += c.v.delivered
		r.Gaps += c.v.gaps
		r.Duplicates += c.v.dups
		r.OutOfOrder += c.v.late
		r.Missing += c.v.missing()
		r.Unexpected += c.v.alien
		r.Malformed += c.malformed
		r.Leaves += c.leaves
		r.ServerErrors += c.serverErrors
		if r.FirstServerError == "" {
			r.FirstServerError = c.firstServerError
		}
		if c.err != nil {
			r.Disconnects++
			if r.FirstDisconnect == "" {
				r.FirstDisconnect = c.err.Error()
			}
		}
		lat.merge(&c.lat)
		last = max(last, c.lastNanos.Load())
	}
	if last > 0 {
		r.Elapsed = time.Duration(last - m.start.UnixNano())
	}
	if cfg.clientsPublish() {
		var lastAck int64
		for _, c := range clients {
			r.PublishesAccepted += c.acked.Load()
			lastAck = max(lastAck, c.lastAcked.Load())
		}
		r.PublishElapsed = 0
		if lastAck > 0 {
			r.PublishElapsed = time.Duration(lastAck - m.start.UnixNano())
			r.PublishesPerSec = float64(r.PublishesAccepted) / r.PublishElapsed.Seconds()
		}
	}
	if r.Elapsed > 0 {
		r.DeliveriesPerSec = float64(r.Delivered) / r.Elapsed.Seconds()
	}
	r.LatencyP50 = lat.quantile(0.50)
	r.LatencyP95 = lat.quantile(0.95)
	r.LatencyP99 = lat.quantile(0.99)
	r.LatencyMax = time.Duration(lat.max)
	r.LatencyMean = lat.mean()
	if cfg.Proc.Enabled() {
		r.GatewaySampled = true
		r.GatewayCPUSeconds = after.gateway.CPUSeconds - before.gateway.CPUSeconds
		r.GatewayRSSHighWaterBytes = after.gateway.RSSHighWaterBytes
		if r.Delivered > 0 {
			r.CPUPerDeliveryMicros = r.GatewayCPUSeconds * 1e6 / float64(r.Delivered)
		}
		published := int64(r.Events)
		if cfg.clientsPublish() { // each client published Events
			published *= int64(r.Clients)
		}
		if published > 0 {
			r.CPUPerEventMicros = r.GatewayCPUSeconds * 1e6 / float64(published)
		}
	}
	r.LoadtestCPUSeconds = after.self.CPUSeconds - before.self.CPUSeconds
	return r
}
