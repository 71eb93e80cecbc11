package gateway

import (
	"runtime"
	"sync/atomic"
	"time"

	"github.com/fanwire/fanwire/gateway/internal/fanout"
	"github.com/prometheus/client_golang/prometheus"
)

// client is the hub's view of a connection: a mailbox and a way to wake its
// writer. The transport (native or GraphQL WebSocket) owns the writer.
type client struct {
	mb   fanout.Mailbox // first: the dispatcher touches its first 48 bytes on every delivery
	wake chan struct{}  // static; capacity 1, a pending wake-up is sticky

	// onOverflow is called once, outside the index lock, when a push fails;
	// the transport closes the connection as a slow consumer.
	onOverflow func() // static after newClient
	// onWake, if set, runs after each wake signal (the transport starts a
	// writer if none runs). Set before the client is registered.
	onWake func()
	// onBehind, if set, is called by the dispatcher when the mailbox is
	// over half full (a shared flusher serves the connection sooner). Set
	// before the client is registered.
	onBehind func()
	// encode, if set, builds the subscription list of a delivery from the
	// ids of the client's matching subscriptions (GraphQL); nil: the
	// native protocol's JSON array of ids. Set before the client subscribes.
	encode func(ids []string) *fanout.SubsList

	overflowed atomic.Bool

	wakePending bool // owned by the dispatcher: already on this batch's wake list
	pacePending bool // owned by the dispatcher: already on this batch's pace list

	// Pad to 128 bytes: the allocator places 128-byte objects on 128-byte
	// boundaries, so the mailbox's hot fields share one cache line.
	_ [16]byte
}

func newClient(maxItems, maxBytes int, onOverflow func()) *client {
	c := &client{
		wake:       make(chan struct{}, 1),
		onOverflow: onOverflow,
	}
	c.mb.Init(maxItems, maxBytes)
	return c
}

// subsFor is the subscription list for a delivery to the subscriptions ids.
func (c *client) subsFor(ids []string) *fanout.SubsList {
	if c.encode != nil {
		return c.encode(ids)
	}
	return fanout.EncodeSubsList(ids)
}

// neverFits reports whether a delivery of n bytes is over the mailbox's
// byte bound: it would not fit even in an empty mailbox.
func (c *client) neverFits(n int) bool { return n > c.mb.MaxBytes() }

// signal wakes the writer; it never blocks.
func (c *client) signal() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
	if c.onWake != nil {
		c.onWake()
	}
}

// hub fans events out to clients. Dispatch is called by one goroutine at a
// time (the broker consumer loop); subscribe and unsubscribe by any.
type hub struct {
	idx     *index
	metrics *dispatchMetrics // static; nil: none kept

	// owned by the dispatching goroutine
	m        matcher
	wakeList []*client
	overflow []*client
	paceList []*client
	// batchLast is the cursor of the last broker message of the batch being
	// dispatched (set by the caller before dispatch; "" on brokers without
	// history). dispatch publishes it as last while still holding the index,
	// so a resuming subscription that holds the index for writing sees
	// exactly what was dispatched.
	batchLast  string
	last       atomic.Pointer[string]
	recent     fanout.Recent // durable brokers only (keepRecent)
	keepRecent bool          // static (hubConfig)

	maxPace time.Duration // static
	wakes   wakeBatch     // static; nil: none

	// Views (fanout_view.go); guarded like the index: changed under its write
	// lock, or by the dispatcher under its read lock.
	holders  map[string][]*viewSub // subject → the filtered subscriptions holding it
	vseq     uint64                // dispatcher: the event being dispatched to views
	vscratch []*vnode              // dispatcher
	ending   []*viewSub            // dispatcher: views past a bound in this batch (endView)
	views    viewCount             // filtered subscriptions in the index
	held     atomic.Int64          // documents they hold
	heldLim  heldLimits            // static (hubConfig): bounds on held (fanout_view_budget.go)
	// dispatcher: filter evaluations of this batch, those that were
	// errors (a missing field, a wrong type, the cost limit), and the cost
	// units they spent
	filterEvals, filterErrors int
	filterCost                uint64
	maxConnCost               uint64           // static (hubConfig)
	now                       time.Time        // dispatcher: when the batch started
	clock                     func() time.Time // static (hubConfig): the filter budgets' clock
}

// dispatchMetrics are the counters the hub keeps (the Server's Metrics
// registers them).
type dispatchMetrics struct {
	Deliveries        prometheus.Counter
	DispatchLatency   prometheus.Observer
	DispatchPaced     prometheus.Counter
	FilterEvaluations prometheus.Counter
	FilterErrors      prometheus.Counter
	FilterCost        prometheus.Counter
}

// wakeBatch is what a transport does around a batch's wake-ups: the
// shared flushers (flusher.go) hold their start while the dispatcher
// wakes the batch's connections, then start once.
type wakeBatch interface {
	hold()
	release()
}

// hubConfig is what a hub is made with.
type hubConfig struct {
	metrics *dispatchMetrics // nil: none
	maxPace time.Duration    // the longest a batch waits for behind mailboxes (Config.MaxPace)
	wakes   wakeBatch        // nil: none
	// keepRecent: the broker keeps history, and resumes are handed over
	// to the live feed through the recent ring.
	keepRecent bool
	// maxConnCost is what one connection's filters may spend on one event
	// (Config.MaxFilterCostPerEvent; 0: no bound).
	maxConnCost uint64
	// heldPerConn and heldPerNode bound the documents views hold
	// (Config.MaxViewDocumentsPerConnection, MaxViewDocuments; 0: none).
	heldPerConn, heldPerNode int64
	clock                    func() time.Time // the filter budgets' clock; nil: time.Now
}

func newHub(cfg hubConfig) *hub {
	h := &hub{idx: newIndex(), metrics: cfg.metrics, maxPace: cfg.maxPace, wakes: cfg.wakes,
		keepRecent: cfg.keepRecent, maxConnCost: cfg.maxConnCost, clock: cfg.clock}
	h.heldLim = heldLimits{perConn: cfg.heldPerConn, perNode: cfg.heldPerNode, node: &h.held}
	if h.clock == nil {
		h.clock = time.Now
	}
	return h
}

// dispatch queues each event to every matching client and wakes each
// client's writer once per batch, however many events it got: fewer wake-ups
// mean bigger frames, the main lever of fan-out throughput (see NOTES: 1.0 →
// 1.8 M deliveries/s at 2,000 clients). It never blocks on a client.
//
// Pacing: when at least a quarter of a batch's deliveries land in mailboxes
// that are over half full, the clients as a whole are behind (the node or
// its network is saturated), not one slow client. Disconnecting them all
// would only start a reconnect storm, so the dispatcher waits (at most
// maxPace) for those mailboxes to drain below half before it takes the next
// batch; meanwhile the backlog waits upstream, in the broker, whose own
// bounds and metrics then apply. A minority of slow clients never triggers
// the wait: they overflow and are closed with 4008.
func (h *hub) dispatch(evs []*fanout.Event, arrived time.Time) {
	var st dispatchStats
	h.idx.mu.RLock()
	views := h.idx.vsize > 0
	if views {
		h.now = h.clock()
	}
	for _, ev := range evs {
		if h.keepRecent {
			h.recent.Add(ev)
		}
		if views {
			h.dispatchView(ev, &st)
		}
		for _, d := range h.m.match(h.idx, ev.Subject) {
			h.push(d.c, fanout.Item{Ev: ev, Subs: d.subs}, len(ev.Bytes())+d.subsLen, &st)
		}
	}
	if h.batchLast != "" {
		l := h.batchLast
		h.last.Store(&l)
	}
	h.idx.mu.RUnlock()
	if views {
		// The parsed data served this batch's filters.
		for _, ev := range evs {
			ev.DropParsed()
		}
	}
	n, pressured, critical := st.n, st.pressured, st.critical
	if h.filterEvals > 0 && h.metrics != nil {
		h.metrics.FilterEvaluations.Add(float64(h.filterEvals))
		h.metrics.FilterErrors.Add(float64(h.filterErrors))
		h.metrics.FilterCost.Add(float64(h.filterCost))
	}
	h.filterEvals, h.filterErrors, h.filterCost = 0, 0, 0
	for i, vs := range h.ending {
		vs.onEnd(vs.endCode)
		h.ending[i] = nil
	}
	h.ending = h.ending[:0]
	if len(h.wakeList) > 0 {
		// Connections served by flushers are queued on their shards and
		// each flusher starts once, after the whole list.
		if h.wakes != nil {
			h.wakes.hold()
		}
		for i, c := range h.wakeList {
			c.wakePending = false
			c.signal()
			h.wakeList[i] = nil
		}
		h.wakeList = h.wakeList[:0]
		if h.wakes != nil {
			h.wakes.release()
		}
	}
	for i, c := range h.overflow {
		c.onOverflow()
		h.overflow[i] = nil
	}
	h.overflow = h.overflow[:0]
	if h.metrics != nil {
		h.metrics.Deliveries.Add(float64(n))
		if !arrived.IsZero() {
			h.metrics.DispatchLatency.Observe(time.Since(arrived).Seconds())
		}
	}
	for _, c := range h.paceList {
		if c.onBehind != nil {
			c.onBehind()
		}
	}
	if pressured > 0 && pressured*4 >= n {
		h.pace()
	} else if critical > 0 {
		// A client is about to overflow. If its writer is merely waiting
		// in the run queue (the dispatcher keeps its processor for up to a
		// 10 ms time slice), yielding lets it run before the next batch. A
		// slow client blocked in a write is not runnable: the yield
		// returns at once and it overflows. Yielding only then, not after
		// every batch, keeps the dispatcher on its core and its caches
		// (docs/benchmarks.md, "Hot-path microbenchmarks", has the
		// figures).
		runtime.Gosched()
	}
	for i, c := range h.paceList {
		c.pacePending = false
		h.paceList[i] = nil
	}
	h.paceList = h.paceList[:0]
}

// dispatchStats counts a batch's deliveries for the dispatcher's pacing
// (Deliveries, and how many found their mailbox half or nearly full).
type dispatchStats struct {
	n, pressured, critical int
}

// push queues it (size bytes) for c: the hub's one delivery path, for the
// index's subscriptions and the views' alike. On the dispatcher, with the
// index held for reading. A full mailbox marks c to be closed as a slow
// consumer after the batch, unless the delivery could never fit it
// (skipped, as a resume skips it); a delivery that filled it past half
// marks c to be paced, one into an empty mailbox to be woken.
func (h *hub) push(c *client, it fanout.Item, size int, st *dispatchStats) {
	wasEmpty, fill, err := c.mb.Push(it, size)
	if err != nil {
		if c.neverFits(size) {
			return
		}
		if c.overflowed.CompareAndSwap(false, true) {
			h.overflow = append(h.overflow, c)
		}
		return
	}
	st.n++
	if fill == fanout.FillCritical {
		st.critical++
	}
	if fill >= fanout.FillHalf {
		st.pressured++
		if !c.pacePending {
			c.pacePending = true
			h.paceList = append(h.paceList, c)
		}
	}
	if wasEmpty && !c.wakePending {
		c.wakePending = true
		h.wakeList = append(h.wakeList, c)
	}
}

// lastCursor is the cursor of the last message dispatched ("" before any,
// or on brokers without history). Read under the index's write lock it is
// exact: nothing is being dispatched.
func (h *hub) lastCursor() string {
	if p := h.last.Load(); p != nil {
		return *p
	}
	return ""
}

// setStart records where the live feed starts (before any dispatch).
func (h *hub) setStart(cursor string) {
	if cursor != "" {
		h.idx.mu.Lock() // resumes read recent under the write lock
		h.last.Store(&cursor)
		h.recent.SetFloor(cursor)
		h.idx.mu.Unlock()
	}
}

// pace waits until every client in paceList is at most half full, or
// maxPace has passed. Waiting for the stragglers too keeps a client that is
// a little behind the others from being cut while the node is saturated; a
// client that is really slow still overflows, because once the majority has
// drained no new wait starts.
func (h *hub) pace() {
	start := time.Now()
	for {
		still := 0
		for _, c := range h.paceList {
			if c.mb.OverHalf() {
				still++
			}
		}
		waited := time.Since(start)
		if still == 0 || waited >= h.maxPace {
			if h.metrics != nil {
				h.metrics.DispatchPaced.Add(waited.Seconds())
			}
			return
		}
		time.Sleep(100 * time.Microsecond)
	}
}
