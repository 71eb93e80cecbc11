package gateway

import (
	"context"
	"strconv"
	"time"
)

// A connection's rate and error policy: every client message counts against
// MaxMessageRate (a token bucket), and a client error is answered, counted,
// and past MaxClientErrors within ErrorWindow closes the connection (1008).

// admit counts a client message against MaxMessageRate; one over it is
// reported (rate_limited, with the message's id when it has one; GraphQL:
// close 1008) and must be dropped. data is the message (nil for a
// WebSocket ping). Called by the reader only.
func (c *conn) admit(data []byte) bool {
	if c.rate.allow(time.Now(), c.s.cfg.MaxMessageRate) {
		return true
	}
	if c.gql != nil { // the protocol has no error without an operation
		c.s.metrics.ClientErrors.WithLabelValues(CodeRateLimited).Inc()
		c.closeWith(ClosePolicy, "message rate over the limit")
		return false
	}
	var id string
	if data != nil {
		id = frameID(data)
	}
	c.clientError(id, CodeRateLimited, "over "+strconv.Itoa(c.s.cfg.MaxMessageRate)+" messages per second: this one was dropped, and so is every following one until a second has passed: send it again after that, in order")
	return false
}

// onPing is the websocket library's callback for a client's WebSocket
// ping; it reports whether to answer with a pong. A ping is a client
// message like any other: over MaxMessageRate it gets no pong and counts
// as rate_limited, so a ping flood costs a read per ping, not a write,
// and soon closes the connection (1008) like any flood. The library calls
// it inside Read, on the reader, except while Close waits for the peer's
// close frame (on the writer, after a close was requested): then it
// touches nothing of the reader's and sends no more pongs.
func (c *conn) onPing(context.Context, []byte) bool {
	return c.closeCode.Load() == 0 && c.admit(nil)
}

// tokenBucket limits a connection's message rate: rate per second, with a
// burst of twice that. Once it has dropped a message it sheds: every
// following message is dropped too until the bucket holds rate tokens again
// (a second at least). A client's messages are then dropped from the first
// one over the rate to the last one it sent before it heard of the drop,
// never one here and one there, so a client that pauses a second after the
// last rate_limited it got and sends them again keeps their order (what
// fanwire.js does). A flood costs the same: it is dropped either way.
// Owned by the reader.
type tokenBucket struct {
	tokens   float64
	last     time.Time
	shedding bool
}

// allow takes a token; rate <= 0 means no limit.
func (b *tokenBucket) allow(now time.Time, rate int) bool {
	if rate <= 0 {
		return true
	}
	burst := float64(2 * rate)
	if b.last.IsZero() {
		b.tokens = burst
	} else {
		b.tokens = min(burst, b.tokens+now.Sub(b.last).Seconds()*float64(rate))
	}
	b.last = now
	if b.shedding && b.tokens < float64(rate) {
		return false
	}
	b.shedding = false
	if b.tokens < 1 {
		b.shedding = true
		return false
	}
	b.tokens--
	return true
}

// clientError reports a protocol error to the client. A client error never
// closes the connection, but more than MaxClientErrors of them within
// ErrorWindow is abuse: the connection is closed with 1008.
func (c *conn) clientError(id, code, msg string) {
	c.sendClientError(code, c.errorMsg(id, code, msg))
}

// sendClientError counts a client error with code and sends its message b;
// past MaxClientErrors within ErrorWindow the connection is closed with
// 1008. Called by the reader only.
func (c *conn) sendClientError(code string, b []byte) {
	c.countClientError(code)
	c.send(b)
	c.closeOnTooManyErrors()
}

// countClientError counts a client error with code, in the metric and in
// the connection's ErrorWindow. Called by the reader only (or while it
// waits for a GraphQL operation it runs).
func (c *conn) countClientError(code string) {
	c.s.metrics.ClientErrors.WithLabelValues(code).Inc()
	now := time.Now()
	if now.Sub(c.errSince) > c.s.cfg.ErrorWindow {
		c.errSince, c.errCount = now, 0
	}
	c.errCount++
}

// closeOnTooManyErrors closes the connection with 1008 (after what is
// queued) when it is past MaxClientErrors. Called by the reader only.
func (c *conn) closeOnTooManyErrors() {
	if c.errCount > c.s.cfg.MaxClientErrors {
		c.requestClose(ClosePolicy)
	}
}

// spendFilterCost charges cost units a filter spent outside the dispatcher
// (a snapshot, a replay, a feed, a hand-over) to the connection's budget,
// and waits while it is in debt: those run on the connection's own
// goroutines, so an expensive filter over a big snapshot slows that
// snapshot, not the node.
func (c *conn) spendFilterCost(ctx context.Context, cost uint64) error {
	if cost == 0 {
		return nil
	}
	wait := c.filters.Charge(c.s.hub.Now(), cost)
	if wait == 0 {
		return nil
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
