package admission

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

var (
	// ErrConnectRate: the queue is full, or the request would wait (or
	// has waited) longer than ConnectQueueWait.
	ErrConnectRate = errors.New("connect rate: queue full")
	// ErrClosed: the server is draining.
	ErrClosed = errors.New("admission closed: server draining")
)

// Clock is the admission's time: the wall clock, or a test's
// (ManualClock), so that a test decides when a token comes.
type Clock interface {
	Now() time.Time
	// Timer returns a channel that receives once the clock reads at or
	// later, and a function that releases the timer. A time, not a
	// duration: a test's clock may move between reading Now and this call.
	Timer(at time.Time) (<-chan time.Time, func())
}

type wallClock struct{}

func (wallClock) Now() time.Time { return time.Now() }

func (wallClock) Timer(at time.Time) (<-chan time.Time, func()) {
	t := time.NewTimer(time.Until(at))
	return t.C, func() { t.Stop() }
}

// Admission is the connect rate limiter with its queue of waiting upgrade
// requests. The zero rate admits every request at once.
type Admission struct {
	rate     float64       // static: tokens per second; 0: no limit
	burst    float64       // static: bucket depth, at least 1
	maxQueue int           // static: most waiters
	maxWait  time.Duration // static: longest wait in the queue
	queued   prometheus.Gauge
	waited   prometheus.Observer
	closed   chan struct{} // closed by close: the server drains

	mu     sync.Mutex
	clock  Clock     // guarded by mu (a test swaps it before any request)
	tokens float64   // guarded by mu: free tokens as of last
	last   time.Time // guarded by mu
	head   *waiter   // guarded by mu: the queue, oldest first
	tail   *waiter   // guarded by mu
	n      int       // guarded by mu: waiters in the queue
	once   sync.Once // closes closed
}

// waiter is one upgrade request in the queue.
type waiter struct {
	turn       chan struct{} // closed when the waiter reaches the head
	prev, next *waiter       // guarded by Admission.mu
}

// Config is what an Admission is made with; the Config fields
// named are the gateway's.
type Config struct {
	Rate      int           // Config.MaxConnectRate: upgrades per second; 0: no limit
	Burst     int           // Config.ConnectBurst
	Queue     int           // Config.ConnectQueue: most waiters
	QueueWait time.Duration // Config.ConnectQueueWait: longest wait in the queue
	Queued    prometheus.Gauge
	Waited    prometheus.Observer
}

// New makes an admission; it admits every request at once when the rate
// is 0.
func New(cfg Config) *Admission {
	a := &Admission{
		maxQueue: cfg.Queue,
		maxWait:  cfg.QueueWait,
		clock:    wallClock{},
		queued:   cfg.Queued,
		waited:   cfg.Waited,
		closed:   make(chan struct{}),
	}
	if cfg.Rate > 0 {
		a.rate = float64(cfg.Rate)
		a.burst = float64(max(cfg.Burst, 1))
		a.tokens = a.burst
	}
	return a
}

// SetClock makes the admission run by c instead of the wall clock. Call
// it before any request.
func (a *Admission) SetClock(c Clock) {
	a.mu.Lock()
	a.clock = c
	a.mu.Unlock()
}

// Wait admits the request whose context is ctx: at once while tokens are
// free and nobody waits, else in its turn in the queue. It returns nil when
// admitted; ErrConnectRate (with the Retry-After to send, in seconds) when
// the queue is full or the wait would pass maxWait; ErrClosed when
// the server drains; ctx's error when the client gave up.
func (a *Admission) Wait(ctx context.Context) (retryAfter int, err error) {
	if a.rate == 0 {
		return 0, nil
	}
	select {
	case <-a.closed:
		return 0, ErrClosed
	default:
	}
	a.mu.Lock()
	clk := a.clock
	start := clk.Now()
	a.refillLocked(start)
	if a.head == nil && a.tokens >= 1 {
		a.tokens--
		a.mu.Unlock()
		a.waited.Observe(0)
		return 0, nil
	}
	// Refused at once when its turn would come after maxWait: the waiters
	// ahead of it are admitted one token each, at the rate (fewer, if some
	// leave), so this is the longest it would wait.
	if a.n >= a.maxQueue || a.etaLocked(a.n) > a.maxWait {
		retry := a.retryAfterLocked()
		a.mu.Unlock()
		return retry, ErrConnectRate
	}
	w := &waiter{turn: make(chan struct{})}
	a.pushLocked(w)
	a.mu.Unlock()
	a.queued.Inc()
	defer a.queued.Dec()

	// A backstop: the estimate above holds unless the head waiter is not
	// scheduled in time.
	deadline, stopDeadline := clk.Timer(start.Add(a.maxWait))
	defer stopDeadline()
	turn := w.turn
	var tick <-chan time.Time
	stopTick := func() {}
	defer func() { stopTick() }()
	late := false
	for {
		select {
		case <-turn:
			turn = nil
		case <-tick:
		case <-deadline:
			// Its token may be due at this very time: the head tries once
			// more before it gives up.
			late = true
		case <-ctx.Done():
			a.leave(w)
			return 0, ctx.Err()
		case <-a.closed:
			a.leave(w)
			return 0, ErrClosed
		}
		a.mu.Lock()
		now := clk.Now()
		if a.head == w {
			// At the head: take a token, or sleep until the next is due.
			a.refillLocked(now)
			if a.tokens >= 1 {
				a.tokens--
				a.removeLocked(w)
				a.mu.Unlock()
				a.waited.Observe(now.Sub(start).Seconds())
				return 0, nil
			}
		}
		if late {
			a.removeLocked(w)
			retry := a.retryAfterLocked()
			a.mu.Unlock()
			return retry, ErrConnectRate
		}
		if a.head != w {
			a.mu.Unlock()
			continue
		}
		due := time.Duration(math.Ceil((1 - a.tokens) / a.rate * float64(time.Second)))
		a.mu.Unlock()
		stopTick()
		tick, stopTick = clk.Timer(now.Add(due))
	}
}

// Close refuses every waiting and future request (ErrClosed): the
// server drains. Idempotent.
func (a *Admission) Close() { a.once.Do(func() { close(a.closed) }) }

// refillLocked adds the tokens earned since the last refill.
func (a *Admission) refillLocked(now time.Time) {
	if el := now.Sub(a.last); el > 0 {
		a.tokens = min(a.burst, a.tokens+el.Seconds()*a.rate)
		a.last = now
	}
}

// etaLocked is how long a request with ahead waiters before it would wait
// for its token.
func (a *Admission) etaLocked(ahead int) time.Duration {
	need := float64(ahead) + 1 - a.tokens
	if need <= 0 {
		return 0
	}
	return time.Duration(need / a.rate * float64(time.Second))
}

// retryAfterLocked is the Retry-After of a refused request, in seconds:
// the time the queue takes to drain (at least 1 s), plus a random share of
// that and of the longest wait, so that a burst of refused clients comes
// back spread over a window instead of all at once.
func (a *Admission) retryAfterLocked() int {
	drain := int(math.Ceil(float64(a.n) / a.rate))
	drain = max(drain, 1)
	spread := drain + int(math.Ceil(a.maxWait.Seconds()))
	return min(drain+rand.IntN(spread+1), 300)
}

func (a *Admission) pushLocked(w *waiter) {
	a.n++
	if a.tail == nil {
		a.head, a.tail = w, w
		close(w.turn)
		return
	}
	w.prev = a.tail
	a.tail.next = w
	a.tail = w
}

// removeLocked takes w out of the queue; when it was the head, the next
// waiter's turn comes.
func (a *Admission) removeLocked(w *waiter) {
	a.n--
	if w.prev != nil {
		w.prev.next = w.next
	} else {
		a.head = w.next
		if w.next != nil {
			close(w.next.turn)
		}
	}
	if w.next != nil {
		w.next.prev = w.prev
	} else {
		a.tail = w.prev
	}
	w.prev, w.next = nil, nil
}

func (a *Admission) leave(w *waiter) {
	a.mu.Lock()
	a.removeLocked(w)
	a.mu.Unlock()
}

// ManualClock is a clock that stands still until Advance, so a test
// decides when the next token comes.
type ManualClock struct {
	mu     sync.Mutex
	now    time.Time               // guarded by mu
	timers map[*fakeTimer]struct{} // guarded by mu: not fired, not stopped
}

type fakeTimer struct {
	at time.Time      // static
	c  chan time.Time // buffered: one value
}

// Advance moves the clock on by d and fires the timers due by then.
func (c *ManualClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	for t := range c.timers {
		if !t.at.After(c.now) {
			t.c <- c.now
			delete(c.timers, t)
		}
	}
}

func (c *ManualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *ManualClock) Timer(at time.Time) (<-chan time.Time, func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &fakeTimer{at: at, c: make(chan time.Time, 1)}
	if !at.After(c.now) {
		t.c <- c.now
		return t.c, func() {}
	}
	c.timers[t] = struct{}{}
	return t.c, func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		delete(c.timers, t)
	}
}

// NewManualClock is a ManualClock at a fixed time.
func NewManualClock() *ManualClock {
	return &ManualClock{now: time.Unix(1_000_000_000, 0), timers: make(map[*fakeTimer]struct{})}
}
