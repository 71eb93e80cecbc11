package loadtest

import (
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"
	"time"
)

// WriteTable writes r as an aligned, human-readable table. Write errors are
// ignored: the table is for a terminal; use WriteJSON for machines.
func (r *Result) WriteTable(w io.Writer) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	row := func(name, format string, args ...any) {
		_, _ = fmt.Fprintf(tw, "%s\t"+format+"\n", append([]any{name}, args...)...)
	}
	pace := "burst"
	if r.Rate > 0 {
		pace = fmt.Sprintf("%d/s", r.Rate)
	}
	row("subject", "%s", r.Subject)
	row("load", "%d clients × %d events × %d B, %s", r.Clients, r.Events, r.Size, pace)
	if r.Where != "" {
		row("views", "where %s, %d document(s) per client: each event to one client", r.Where, r.WhereDocs)
	}
	row("delivered", "%d / %d (%.1f%%)", r.Delivered, r.Expected, percent(r.Delivered, r.Expected))
	row("gaps / dups / out of order", "%d / %d / %d", r.Gaps, r.Duplicates, r.OutOfOrder)
	row("missing", "%d", r.Missing)
	if r.Unexpected+r.Malformed > 0 {
		row("unexpected / malformed", "%d / %d", r.Unexpected, r.Malformed)
	}
	if r.Leaves > 0 {
		row("leaves", "%d (none expected)", r.Leaves)
	}
	if r.ServerErrors > 0 {
		row("server errors", "%d, first: %s", r.ServerErrors, r.FirstServerError)
	}
	if r.Disconnects > 0 {
		row("disconnects", "%d, first: %s", r.Disconnects, r.FirstDisconnect)
	}
	if rs := r.Resume; rs != nil {
		row("resuming clients", "%d × %d drops (seed %d)", rs.Clients, rs.Drops, rs.Seed)
		row("reconnects", "%d: reconnect %s, catch-up %s (totals)", rs.Reconnects, roundDur(rs.ReconnectTime), roundDur(rs.CatchUpTime))
	}
	if c := r.Churn; c != nil {
		writeChurn(row, c)
	}
	if st := r.Storm; st != nil {
		writeStorm(row, st)
	}
	row("elapsed", "%s (publish %s)", roundDur(r.Elapsed), roundDur(r.PublishElapsed))
	if r.PublishVia == PublishViaWS || r.PublishVia == PublishViaHTTP {
		row("publishes accepted", "%d via %s, %s/s", r.PublishesAccepted, r.PublishVia, siRate(r.PublishesPerSec))
	}
	row("deliveries/s", "%s", siRate(r.DeliveriesPerSec))
	row("latency p50 / p95 / p99", "%s / %s / %s", roundDur(r.LatencyP50), roundDur(r.LatencyP95), roundDur(r.LatencyP99))
	row("latency max / mean", "%s / %s", roundDur(r.LatencyMax), roundDur(r.LatencyMean))
	if r.GatewaySampled {
		row("gateway cpu", "%.2f s (%.3f µs/delivery, %.3f µs/event)", r.GatewayCPUSeconds, r.CPUPerDeliveryMicros, r.CPUPerEventMicros)
		row("gateway rss high-water", "%.1f MiB", float64(r.GatewayRSSHighWaterBytes)/(1<<20))
	}
	row("loadtest cpu", "%.2f s", r.LoadtestCPUSeconds)
	verdict := "OK"
	switch {
	case r.TimedOut:
		verdict = "FAIL (timed out: no delivery progress)"
	case r.Churn != nil && !r.Churn.OK():
		verdict = "FAIL (" + r.Churn.Problem() + ")"
	case r.Storm != nil && !r.Storm.OK():
		verdict = fmt.Sprintf("FAIL (%d of %d clients back on node B, %d caught up)", r.Storm.Back, r.Storm.Clients, r.Storm.CaughtUp)
	case !r.OK():
		verdict = "FAIL"
	}
	row("result", "%s", verdict)
	_ = tw.Flush()
}

// resultJSON fixes the JSON field names and units: durations are float
// seconds or microseconds, named so.
type resultJSON struct {
	OK                       bool        `json:"ok"`
	Subject                  string      `json:"subject"`
	Clients                  int         `json:"clients"`
	Events                   int         `json:"events"`
	Size                     int         `json:"size"`
	Rate                     int         `json:"rate"`
	Expected                 int64       `json:"expected"`
	Delivered                int64       `json:"delivered"`
	Gaps                     int64       `json:"gaps"`
	Duplicates               int64       `json:"duplicates"`
	OutOfOrder               int64       `json:"out_of_order"`
	Missing                  int64       `json:"missing"`
	Unexpected               int64       `json:"unexpected"`
	Malformed                int64       `json:"malformed"`
	Leaves                   int64       `json:"leaves"`
	ServerErrors             int64       `json:"server_errors"`
	FirstServerError         string      `json:"first_server_error,omitempty"`
	Disconnects              int         `json:"disconnects"`
	FirstDisconnect          string      `json:"first_disconnect,omitempty"`
	TimedOut                 bool        `json:"timed_out"`
	ElapsedSeconds           float64     `json:"elapsed_seconds"`
	PublishSeconds           float64     `json:"publish_seconds"`
	DeliveriesPerSec         float64     `json:"deliveries_per_sec"`
	LatencyP50Micros         float64     `json:"latency_p50_micros"`
	LatencyP95Micros         float64     `json:"latency_p95_micros"`
	LatencyP99Micros         float64     `json:"latency_p99_micros"`
	LatencyMaxMicros         float64     `json:"latency_max_micros"`
	LatencyMeanMicros        float64     `json:"latency_mean_micros"`
	GatewayCPUSeconds        *float64    `json:"gateway_cpu_seconds,omitempty"`
	GatewayRSSHighWaterBytes *int64      `json:"gateway_rss_high_water_bytes,omitempty"`
	CPUPerDeliveryMicros     *float64    `json:"cpu_per_delivery_micros,omitempty"`
	CPUPerEventMicros        *float64    `json:"cpu_per_event_micros,omitempty"`
	LoadtestCPUSeconds       float64     `json:"loadtest_cpu_seconds"`
	PublishVia               string      `json:"publish_via,omitempty"`
	Where                    string      `json:"where,omitempty"`
	WhereDocs                int         `json:"where_docs,omitempty"`
	PublishesAccepted        *int64      `json:"publishes_accepted,omitempty"`
	PublishesPerSec          *float64    `json:"publishes_per_sec,omitempty"`
	Resume                   *resumeJSON `json:"resume,omitempty"`
	Churn                    *churnJSON  `json:"churn,omitempty"`
	Storm                    *stormJSON  `json:"storm,omitempty"`
}

type resumeJSON struct {
	Clients          int     `json:"clients"`
	DropsPerClient   int     `json:"drops_per_client"`
	Seed             uint64  `json:"seed"`
	Reconnects       int     `json:"reconnects"`
	ReconnectSeconds float64 `json:"reconnect_seconds"`
	CatchUpSeconds   float64 `json:"catch_up_seconds"`
}

// WriteJSON writes r as one JSON object with snake_case keys, then a newline.
// The gateway_* and cpu_per_* keys are present only when the
// gateway was sampled, the publish_* keys only when the clients published
// (publish_via ws or http), "resume" only when clients dropped and resumed,
// "churn" only in a churn run and "storm" only in a reconnect storm.
func (r *Result) WriteJSON(w io.Writer) error {
	j := resultJSON{
		OK: r.OK(), Subject: r.Subject,
		Clients: r.Clients, Events: r.Events, Size: r.Size, Rate: r.Rate,
		Expected: r.Expected, Delivered: r.Delivered,
		Gaps: r.Gaps, Duplicates: r.Duplicates, OutOfOrder: r.OutOfOrder, Missing: r.Missing,
		Unexpected: r.Unexpected, Malformed: r.Malformed, Leaves: r.Leaves,
		Where: r.Where, WhereDocs: r.WhereDocs,
		ServerErrors: r.ServerErrors, FirstServerError: r.FirstServerError,
		Disconnects: r.Disconnects, FirstDisconnect: r.FirstDisconnect, TimedOut: r.TimedOut,
		ElapsedSeconds:     r.Elapsed.Seconds(),
		PublishSeconds:     r.PublishElapsed.Seconds(),
		DeliveriesPerSec:   r.DeliveriesPerSec,
		LatencyP50Micros:   micros(r.LatencyP50),
		LatencyP95Micros:   micros(r.LatencyP95),
		LatencyP99Micros:   micros(r.LatencyP99),
		LatencyMaxMicros:   micros(r.LatencyMax),
		LatencyMeanMicros:  micros(r.LatencyMean),
		LoadtestCPUSeconds: r.LoadtestCPUSeconds,
	}
	if r.GatewaySampled {
		j.GatewayCPUSeconds = &r.GatewayCPUSeconds
		j.GatewayRSSHighWaterBytes = &r.GatewayRSSHighWaterBytes
		j.CPUPerDeliveryMicros = &r.CPUPerDeliveryMicros
		j.CPUPerEventMicros = &r.CPUPerEventMicros
	}
	if r.PublishVia == PublishViaWS || r.PublishVia == PublishViaHTTP {
		j.PublishVia, j.PublishesAccepted, j.PublishesPerSec = r.PublishVia, &r.PublishesAccepted, &r.PublishesPerSec
	}
	if rs := r.Resume; rs != nil {
		j.Resume = &resumeJSON{rs.Clients, rs.Drops, rs.Seed, rs.Reconnects, rs.ReconnectTime.Seconds(), rs.CatchUpTime.Seconds()}
	}
	if c := r.Churn; c != nil {
		j.Churn = newChurnJSON(c)
	}
	if st := r.Storm; st != nil {
		j.Storm = newStormJSON(st)
	}
	if err := json.NewEncoder(w).Encode(j); err != nil {
		return fmt.Errorf("write result: %w", err)
	}
	return nil
}

func micros(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

func percent(n, of int64) float64 {
	if of == 0 {
		return 0
	}
	return 100 * float64(n) / float64(of)
}

// roundDur keeps three or so significant digits: 1.234s, 12.345ms, 850µs.
func roundDur(d time.Duration) time.Duration {
	switch {
	case d >= time.Second:
		return d.Round(time.Millisecond)
	case d >= time.Millisecond:
		return d.Round(time.Microsecond)
	default:
		return d.Round(time.Microsecond / 10)
	}
}
