package fanout

import (
	"runtime"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Hub fans events out to clients: the subscription index, the view index
// and the dispatcher. Dispatch is called by one goroutine at a time (the
// broker's consume loop); everything else by any.
type Hub struct {
	idx     *index
	metrics *DispatchMetrics // static; nil: none kept

	// owned by the dispatching goroutine
	m          matcher
	wakeList   []*Client
	overflow   []*Client
	paceList   []*Client
	last       atomic.Pointer[string] // the cursor of the last broker message dispatched
	recent     Recent                 // durable brokers only (KeepRecent)
	keepRecent bool                   // static (HubConfig)

	maxPace time.Duration // static
	wakes   WakeBatch     // static; nil: none

	// Views (view.go); guarded like the index: changed under its write
	// lock, or by the dispatcher under its read lock.
	holders  map[string][]*View // subject → the filtered subscriptions holding it
	vseq     uint64             // dispatcher: the event being dispatched to views
	vscratch []*vnode           // dispatcher
	ending   []*View            // dispatcher: views past a bound in this batch (endView)
	held     atomic.Int64       // documents the views hold (read without the lock: HeldLimits, the gauge)
	heldLim  HeldLimits         // static (HubConfig): bounds on held (budget.go)
	// dispatcher: filter evaluations of this batch, those that were
	// errors (a missing field, a wrong type, the cost limit), and the cost
	// units they spent
	filterEvals, filterErrors int
	filterCost                uint64
	maxConnCost               uint64           // static (HubConfig)
	now                       time.Time        // dispatcher: when the batch started
	clock                     func() time.Time // static (HubConfig): the filter budgets' clock
}

// DispatchMetrics are the counters the hub keeps (the gateway's metrics
// register them).
type DispatchMetrics struct {
	Deliveries        prometheus.Counter
	DispatchLatency   prometheus.Observer
	DispatchPaced     prometheus.Counter
	FilterEvaluations prometheus.Counter
	FilterErrors      prometheus.Counter
	FilterCost        prometheus.Counter
}

// WakeBatch is what a transport does around a batch's wake-ups: the
// gateway's shared flushers hold their start while the dispatcher wakes
// the batch's connections, then start once.
type WakeBatch interface {
	Hold()
	Release()
}

// HubConfig is what a hub is made with. The Config fields named are the
// gateway's.
type HubConfig struct {
	Metrics *DispatchMetrics // nil: none
	MaxPace time.Duration    // the longest a batch waits for behind mailboxes (Config.MaxPace)
	Wakes   WakeBatch        // nil: none
	// KeepRecent: the broker keeps history, and resumes are handed over
	// to the live feed through the recent ring.
	KeepRecent bool
	// MaxConnCost is what one connection's filters may spend on one event
	// (Config.MaxFilterCostPerEvent; 0: no bound).
	MaxConnCost uint64
	// HeldPerConn and HeldPerNode bound the documents views hold
	// (Config.MaxViewDocumentsPerConnection, MaxViewDocuments; 0: none).
	HeldPerConn, HeldPerNode int64
	Clock                    func() time.Time // the filter budgets' clock; nil: time.Now
}

// NewHub makes a hub with no subscriptions.
func NewHub(cfg HubConfig) *Hub {
	h := &Hub{idx: newIndex(), metrics: cfg.Metrics, maxPace: cfg.MaxPace, wakes: cfg.Wakes,
		keepRecent: cfg.KeepRecent, maxConnCost: cfg.MaxConnCost, clock: cfg.Clock}
	h.heldLim = HeldLimits{perConn: cfg.HeldPerConn, perNode: cfg.HeldPerNode, node: &h.held}
	if h.clock == nil {
		h.clock = time.Now
	}
	return h
}

// Dispatch queues each event of a batch to every matching client and
// view, and wakes each client's writer once per batch however many events
// it got (fewer wake-ups make bigger frames). It never blocks on a
// client: a push into a full mailbox marks the client Overflowed and
// calls its OnOverflow after the batch. When at least a quarter of the
// batch's deliveries land in mailboxes over half full, the clients as a
// whole are behind, not one of them: Dispatch then waits (at most
// MaxPace) for those mailboxes to drain below half before it returns
// (docs/architecture.md, "Concurrency").
//
// last is the cursor of the batch's last broker message ("" on brokers
// without history), which may be an event that was not dispatched;
// Dispatch publishes it as LastCursor while still holding the index, so a
// resume that holds the index (Locked) sees exactly what was dispatched.
// arrived is when the batch arrived (zero: not observed).
func (h *Hub) Dispatch(evs []*Event, last string, arrived time.Time) {
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
			h.push(d.c, Item{Ev: ev, Subs: d.subs}, len(ev.Bytes())+d.subsLen, &st)
		}
	}
	if last != "" {
		l := last // only this copy escapes: the parameter stays on the stack
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
		vs.OnEnd(vs.endCode)
		h.ending[i] = nil
	}
	h.ending = h.ending[:0]
	if len(h.wakeList) > 0 {
		// Connections served by flushers are queued on their shards and
		// each flusher starts once, after the whole list.
		if h.wakes != nil {
			h.wakes.Hold()
		}
		for i, c := range h.wakeList {
			c.wakePending = false
			c.Signal()
			h.wakeList[i] = nil
		}
		h.wakeList = h.wakeList[:0]
		if h.wakes != nil {
			h.wakes.Release()
		}
	}
	for i, c := range h.overflow {
		c.OnOverflow()
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
		if c.OnBehind != nil {
			c.OnBehind()
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
func (h *Hub) push(c *Client, it Item, size int, st *dispatchStats) {
	wasEmpty, fill, err := c.Mailbox.Push(it, size)
	if err != nil {
		if c.NeverFits(size) {
			return
		}
		if c.Overflowed.CompareAndSwap(false, true) {
			h.overflow = append(h.overflow, c)
		}
		return
	}
	st.n++
	if fill == FillCritical {
		st.critical++
	}
	if fill >= FillHalf {
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

// Subscribe registers client c's subscription id on pattern, then runs
// then (if not nil) before releasing the index: no dispatch can happen
// between the two. The caller has checked that id is new for c and that
// pattern is valid. A transport queues its "subscribed" reply in then, so
// the reply is never seen before the subscription is live, nor after an
// event that lists it.
func (h *Hub) Subscribe(c *Client, id, pattern string, then func()) {
	h.idx.addThen(c, id, pattern, then)
}

// Unsubscribe unregisters client c's subscription id on pattern, then
// runs then (if not nil) before releasing the index, like Subscribe. It
// reports whether the subscription was there.
func (h *Hub) Unsubscribe(c *Client, id, pattern string, then func()) bool {
	return h.idx.removeThen(c, id, pattern, then)
}

// Tx is the hub with its index held for writing: nothing is being
// dispatched. It is valid only in the function given to Locked.
type Tx struct{ h *Hub }

// Locked runs f with the index held for writing. f must not wait (the
// dispatcher waits for it); it reports whether it did what it meant to,
// which Locked returns.
func (h *Hub) Locked(f func(tx Tx) bool) bool {
	h.idx.mu.Lock()
	defer h.idx.mu.Unlock()
	return f(Tx{h})
}

// Add registers client c's subscription id on pattern, as Subscribe.
func (tx Tx) Add(c *Client, id, pattern string) { tx.h.idx.addLocked(c, id, pattern) }

// AddView files vs in the view index, with the subjects it holds.
func (tx Tx) AddView(vs *View) { tx.h.addViewLocked(vs) }

// RecentAfter returns the events dispatched after cursor w, oldest first,
// from the recent ring (compare orders two cursors); false: the ring no
// longer reaches back to w.
func (tx Tx) RecentAfter(w string, compare func(a, b string) (int, error)) ([]*Event, bool) {
	return tx.h.recent.After(w, compare)
}

// MaxConnCost is what one connection's filters may spend on one event (0:
// no bound).
func (h *Hub) MaxConnCost() uint64 { return h.maxConnCost }

// HeldLimits are the bounds on the documents views hold, for a new View.
func (h *Hub) HeldLimits() *HeldLimits { return &h.heldLim }

// Now is the filter budgets' clock.
func (h *Hub) Now() time.Time { return h.clock() }

// Views is the number of filtered subscriptions in the index.
func (h *Hub) Views() int {
	h.idx.mu.RLock()
	defer h.idx.mu.RUnlock()
	return h.idx.vsize
}

// Held is the number of documents the views hold.
func (h *Hub) Held() int64 { return h.held.Load() }

// Size reports the subscriptions in the index and the trie nodes that
// hold them (the root excluded): both return to zero when every
// subscription is gone, or the index leaks.
func (h *Hub) Size() (subs, nodes int) {
	ix := h.idx
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	return ix.size, ix.root.Size()
}

// LastCursor is the cursor of the last message dispatched ("" before any,
// or on brokers without history). Read under the index's write lock it is
// exact: nothing is being dispatched.
func (h *Hub) LastCursor() string {
	if p := h.last.Load(); p != nil {
		return *p
	}
	return ""
}

// SetStart records where the live feed starts (before any dispatch).
func (h *Hub) SetStart(cursor string) {
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
func (h *Hub) pace() {
	start := time.Now()
	for {
		still := 0
		for _, c := range h.paceList {
			if c.Mailbox.OverHalf() {
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
