package loadtest

import (
	"math/rand/v2"
	"time"
)

// fanwire.js's policy, the reconnect backoff every browser and Node client
// of the gateway runs (gateway/client/fanwire.js: DEFAULT_BACKOFF {initial:
// 500, max: 30000}, STABLE_AFTER 10000; docs/client.md, "Reconnecting"):
// the n-th retry in a row (n from 0) waits a random time in [0, min(max,
// initial·2ⁿ)] ("full jitter"), and the count starts again from 0 only
// once a connection has stayed ready for stableAfter. A 1001 from a
// draining node is a retry like any other: right after a stable
// connection its wait is 0–500 ms, so a node's clients spread over half a
// second rather than arriving at once. The policy ignores Retry-After:
// a browser never sees the 503 or 429 that refuses its upgrade, only a
// failed attempt.
const (
	backoffInitial = 500 * time.Millisecond
	backoffMax     = 30 * time.Second
	stableAfter    = 10 * time.Second
)

// backoff is one client's reconnect schedule under fanwire.js's policy.
// Owned by the client's reader goroutine.
type backoff struct {
	attempt int        // retries since a connection last stayed up
	rng     *rand.Rand // the jitter's draws
}

// newBackoff returns a client's schedule; seed and id make its draws
// repeatable.
func newBackoff(seed uint64, id int) backoff {
	return backoff{rng: rand.New(rand.NewPCG(seed, uint64(id)))}
}

// next returns the wait before the next attempt and counts the attempt.
func (b *backoff) next() time.Duration {
	limit := backoffCap(b.attempt)
	b.attempt++
	return time.Duration(b.rng.Int64N(int64(limit) + 1))
}

// connected notes a connection that was ready from readyAt until it
// ended at end: one that stayed up stableAfter starts the count again.
func (b *backoff) connected(readyAt, end time.Time) {
	if end.Sub(readyAt) >= stableAfter {
		b.attempt = 0
	}
}

// backoffCap is the longest wait of retry n: min(backoffMax,
// backoffInitial·2ⁿ), the exponent capped at 30 as fanwire.js caps it.
func backoffCap(n int) time.Duration {
	d := backoffInitial << min(n, 30)
	if d > backoffMax || d <= 0 {
		return backoffMax
	}
	return d
}
