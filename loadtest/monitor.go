package loadtest

import (
	"context"
	"fmt"
	"io"
	"sync/atomic"
	"time"
)

// monitor decides when a run is over and prints progress. It runs on Run's
// goroutine and reads the clients' atomic counters only.
type monitor struct {
	cfg     *Config   // static
	clients []*client // static
	start   time.Time // first publish
	soak    *soak     // static: a churn run's, for its progress; nil otherwise
	storm   *storm    // static: a storm run's, for its progress; nil otherwise

	published time.Duration // publish + flush time; 0 if the publisher had not finished
	timedOut  bool          // stopped because delivery made no progress for cfg.Timeout
}

// pollInterval is how often the monitor checks for stalls: often enough that
// a short test Timeout is honoured, rare enough to cost nothing.
func pollInterval(timeout time.Duration) time.Duration {
	return min(max(timeout/10, time.Millisecond), 100*time.Millisecond)
}

// wait returns when every client has finished (holds every event, or lost its
// connection), or delivery stalled for cfg.Timeout (m.timedOut), or with an
// error when the publisher failed or ctx ended.
func (m *monitor) wait(ctx context.Context, finished <-chan struct{}, published <-chan error) error {
	tick := time.NewTicker(pollInterval(m.cfg.Timeout))
	defer tick.Stop()
	p := progress{w: m.cfg.Progress, expected: m.cfg.expectedTotal(), start: m.start, at: m.start}
	if m.soak != nil {
		p.churn = &m.soak.connects
	}
	p.storm = m.storm
	var last int64
	lastChange := m.start
	for done := 0; done < len(m.clients); {
		select {
		case <-finished:
			done++
		case err := <-published:
			if err != nil {
				return fmt.Errorf("publish: %w", err)
			}
			m.published = time.Since(m.start)
			published = nil // a nil channel never fires again
		case now := <-tick.C:
			n := m.delivered()
			if n != last {
				last, lastChange = n, now
			} else if now.Sub(lastChange) >= m.cfg.Timeout {
				m.timedOut = true
				p.final(now, n)
				return nil
			}
			p.tick(now, n)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	p.final(time.Now(), m.delivered())
	return nil
}

// delivered sums the clients' delivered counters.
func (m *monitor) delivered() int64 {
	var n int64
	for _, c := range m.clients {
		n += c.delivered.Load()
	}
	return n
}

// progress writes `delivered 1234567/4000000 (30.8%) 1.21M/s` once a second,
// the rate being that of the last second.
type progress struct {
	w        io.Writer // nil: print nothing
	expected int64
	start    time.Time     // first publish
	at       time.Time     // time of the last line (or of the start)
	n        int64         // delivered at the last line
	churn    *atomic.Int64 // a churn run's sessions so far; nil otherwise
	storm    *storm        // a storm run's; nil otherwise
}

func (p *progress) tick(now time.Time, n int64) {
	if p.w == nil || now.Sub(p.at) < time.Second {
		return
	}
	p.line(n, float64(n-p.n)/now.Sub(p.at).Seconds(), "/s")
	p.at, p.n = now, n
}

// final prints the last line, with the rate over the whole run.
func (p *progress) final(now time.Time, n int64) {
	if p.w == nil {
		return
	}
	p.line(n, float64(n)/max(now.Sub(p.start).Seconds(), 1e-9), "/s overall")
}

func (p *progress) line(n int64, rate float64, unit string) {
	pct := 0.0
	if p.expected > 0 {
		pct = 100 * float64(n) / float64(p.expected)
	}
	churn := ""
	if p.churn != nil {
		churn = fmt.Sprintf(", churn connects %d", p.churn.Load())
	}
	if p.storm != nil {
		churn = fmt.Sprintf(", on node B %d/%d, caught up %d", p.storm.back.Load(), p.storm.clients, p.storm.caught.Load())
	}
	_, _ = fmt.Fprintf(p.w, "delivered %d/%d (%.1f%%) %s%s%s\n", n, p.expected, pct, siRate(rate), unit, churn)
}

// siRate formats a rate with an SI suffix: 1.21M, 850.3k, 12.
func siRate(r float64) string {
	switch {
	case r >= 1e6:
		return fmt.Sprintf("%.2fM", r/1e6)
	case r >= 1e3:
		return fmt.Sprintf("%.1fk", r/1e3)
	default:
		return fmt.Sprintf("%.0f", r)
	}
}
