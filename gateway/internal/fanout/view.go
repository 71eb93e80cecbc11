package fanout

import (
	"errors"
	"slices"
	"strings"

	"github.com/fanwire/fanwire/gateway/internal/filter"
	"github.com/fanwire/fanwire/gateway/internal/trie"
	"github.com/fanwire/fanwire/jsonstr"

	"github.com/fanwire/fanwire/subject"
)

// View is a subscription with a filter (a where, or a grant's row
// filter): a view of the documents under its pattern, keyed by subject.
// It gets the events its filter accepts, and a leave for a subject it
// holds (it was sent a version that passed) when a later event on that
// subject does not pass, or deletes it. Held is those subjects; the hub
// keeps the reverse map (holders) that the dispatcher looks an event's
// subject up in. Views live in a trie of their own beside the index's
// (same lock); per trie node, a filter with an equality of a doc field to
// a constant is filed under that constant (eqIndex), the others are
// scanned (docs/architecture.md, "Live views").
//
// Until it is filed (Tx.AddView), a View is its subscription's goroutine's
// (a snapshot, a replay: Offer); after, the dispatcher's. The fields the
// dispatcher reads for every candidate view come first, in one cache line:
// with 1,000 scanned views an event touches 1,000 of them.
type View struct {
	Filter *filter.Filter // nil only while an unfiltered "latest" snapshot is tracked (the gateway's resume)
	Budget *FilterBudget  // static: its connection's, so that evaluating a view touches no client

	// Dispatcher-owned.
	matched uint64 // seq of the last event delivered to it
	ended   bool   // over a bound: delivers nothing more

	Held   map[string]struct{} // subjects in the view; the task's, then (in the index) the dispatcher's
	Client *Client
	Subs   *SubsList // [id]
	Max    int       // most documents held (Config.MaxSnapshot)
	Lim    *HeldLimits

	ID      string
	Pattern string
	Full    string // the bound it passed (FullView, FullConn, FullNode, FullScan); set by whoever found it
	endCode string // dispatcher: which bound ended it (view_too_large, filter_too_costly)
	// OnEnd ends the subscription with an error code (view_too_large,
	// filter_too_costly); called once, by the dispatcher outside the index
	// lock.
	OnEnd func(code string)
}

// Offer applies one event to a view outside the index (a snapshot, a
// replay, a hand-over), as the dispatcher does in it: deliver reports
// that the event goes to the client, leave that a leave does; tooLarge
// that the view outgrew Max; cost what its filter spent. p is the
// event's parsed data (Event.ParsedNoKeep).
func (vs *View) Offer(subject string, p *filter.Parsed) (deliver, leave, tooLarge bool, cost uint64) {
	ok := true
	if p == nil || !p.Truncate {
		ok, cost = vs.Filter.Accepts(subject, p)
	}
	deliver, leave, tooLarge = vs.Apply(subject, p, ok)
	return deliver, leave, tooLarge, cost
}

// Apply is Offer with the filter's result known: ok, whether it accepts
// the event.
func (vs *View) Apply(subject string, p *filter.Parsed, ok bool) (deliver, leave, tooLarge bool) {
	_, holds := vs.Held[subject]
	switch {
	case p != nil && p.Truncate:
		vs.dropPrefix(subject)
		return true, false, false
	case ok:
		if p != nil && p.Delete {
			delete(vs.Held, subject)
			return holds || vs.Filter != nil, false, false
		}
		if !holds {
			if vs.Full = vs.Lim.full(vs, len(vs.Held)); vs.Full != "" {
				return false, false, true
			}
			vs.Held[subject] = struct{}{}
		}
		return true, false, false
	case holds:
		delete(vs.Held, subject)
		return false, true, false
	}
	return false, false, false
}

// dropPrefix forgets the held subjects under a truncate's prefix
// (db.orders.%truncate: every db.orders.<key>).
func (vs *View) dropPrefix(truncSubject string) {
	prefix := truncSubject[:len(truncSubject)-len(filter.TruncateToken)]
	for s := range vs.Held {
		if strings.HasPrefix(s, prefix) && !strings.Contains(s[len(prefix):], ".") {
			delete(vs.Held, s)
		}
	}
}

// vnode is a node of the view index.
type vnode = trie.Node[viewNode]

// viewNode is what a view index node holds: the filtered subscriptions
// whose pattern ends there.
type viewNode struct {
	scan []*View             // filters without an index term
	eq   map[string]*eqIndex // by IndexTerm.PathKey
}

type eqIndex struct {
	path []string
	by   map[string][]*View // by indexTerm.key
}

// addViewLocked files vs in the view index and its held subjects in
// holders; ix.mu is held for writing.
func (h *Hub) addViewLocked(vs *View) {
	ix := h.idx
	if ix.vroot == nil {
		ix.vroot = &vnode{}
	}
	n := ix.vroot.Walk(vs.Pattern)
	v := &n.Val
	if t := vs.Filter.Index; t != nil {
		if v.eq == nil {
			v.eq = make(map[string]*eqIndex)
		}
		e := v.eq[t.PathKey]
		if e == nil {
			e = &eqIndex{path: t.Path, by: make(map[string][]*View)}
			v.eq[t.PathKey] = e
		}
		e.by[t.Key] = append(e.by[t.Key], vs)
	} else {
		v.scan = append(v.scan, vs)
	}
	n.N++
	ix.vsize++
	if h.holders == nil {
		h.holders = make(map[string][]*View)
	}
	for s := range vs.Held {
		h.holders[s] = append(h.holders[s], vs)
	}
	h.heldAdd(vs, int64(len(vs.Held)))
}

// heldAdd counts n documents more (or fewer) held by vs, on the node and
// on its connection.
func (h *Hub) heldAdd(vs *View, n int64) {
	h.held.Add(n)
	if fb := vs.Budget; fb != nil {
		fb.held.Add(n)
	}
}

// removeView takes vs out of the view index; it reports whether it was
// there.
func (h *Hub) RemoveView(vs *View, then func()) bool {
	ix := h.idx
	ix.mu.Lock()
	defer ix.mu.Unlock()
	if then != nil {
		defer then()
	}
	if ix.vroot == nil {
		return false
	}
	n := ix.vroot.Find(vs.Pattern)
	if n == nil {
		return false
	}
	v := &n.Val
	found := false
	if t := vs.Filter.Index; t != nil {
		if e := v.eq[t.PathKey]; e != nil {
			l := e.by[t.Key]
			if i := indexOf(l, vs); i >= 0 {
				found = true
				l[i] = l[len(l)-1]
				l[len(l)-1] = nil
				if l = l[:len(l)-1]; len(l) == 0 {
					delete(e.by, t.Key)
					if len(e.by) == 0 {
						delete(v.eq, t.PathKey)
					}
				} else {
					e.by[t.Key] = l
				}
			}
		}
	} else if i := indexOf(v.scan, vs); i >= 0 {
		found = true
		last := len(v.scan) - 1
		v.scan[i] = v.scan[last]
		v.scan[last] = nil
		v.scan = v.scan[:last]
	}
	if !found {
		return false
	}
	for s := range vs.Held {
		h.dropHolder(s, vs)
	}
	h.heldAdd(vs, -int64(len(vs.Held)))
	vs.Held = nil
	n.N--
	ix.vsize--
	n.Prune()
	return true
}

func indexOf(l []*View, vs *View) int {
	for i, x := range l {
		if x == vs {
			return i
		}
	}
	return -1
}

func (h *Hub) dropHolder(subject string, vs *View) {
	l := h.holders[subject]
	if i := indexOf(l, vs); i >= 0 {
		l[i] = l[len(l)-1]
		l[len(l)-1] = nil
		l = l[:len(l)-1]
	}
	if len(l) == 0 {
		delete(h.holders, subject)
	} else {
		h.holders[subject] = l
	}
}

// dispatchView delivers ev to the filtered subscriptions: those whose
// filter accepts it get it (each distinct filter evaluated once), those
// that held its subject and no longer do get a leave. The caller holds
// the index for reading and has checked that views exist.
func (h *Hub) dispatchView(ev *Event, st *dispatchStats) {
	h.vseq++
	seq := h.vseq
	literal := subject.IsSystem(ev.Subject)
	h.vscratch = h.idx.vroot.Collect(ev.Subject, h.vscratch[:0], literal)
	holders := h.holders[ev.Subject]
	if len(h.vscratch) == 0 && len(holders) == 0 {
		return
	}
	p := ev.Parsed()
	if p.Truncate {
		for _, n := range h.vscratch {
			for _, vs := range n.Val.scan {
				h.viewTruncate(vs, ev, st)
			}
			for _, e := range n.Val.eq {
				for _, l := range e.by {
					for _, vs := range l {
						h.viewTruncate(vs, ev, st)
					}
				}
			}
		}
		return
	}
	for _, n := range h.vscratch {
		for _, vs := range n.Val.scan {
			h.viewOffer(vs, ev, p, seq, st)
		}
		for _, e := range n.Val.eq {
			v, ok := filter.LookupPath(p.Doc, e.path)
			if !ok {
				continue
			}
			k, ok := filter.ValueKey(v)
			if !ok {
				continue
			}
			for _, vs := range e.by[k] {
				h.viewOffer(vs, ev, p, seq, st)
			}
		}
	}
	// Leaves: holders that did not take this version; newly held
	// subscriptions (viewOffer appended them) are kept.
	holders = h.holders[ev.Subject]
	var leave *Event
	for i := 0; i < len(holders); {
		vs := holders[i]
		if vs.matched == seq && !p.Delete {
			i++
			continue
		}
		delete(vs.Held, ev.Subject)
		h.heldAdd(vs, -1)
		last := len(holders) - 1
		holders[i] = holders[last]
		holders[last] = nil
		holders = holders[:last]
		if vs.matched == seq || vs.ended {
			continue // a delete it was sent: nothing to leave
		}
		if leave == nil {
			leave = NewLeave(ev)
		}
		h.pushView(vs, leave, st)
	}
	if len(holders) == 0 {
		delete(h.holders, ev.Subject)
	} else {
		h.holders[ev.Subject] = holders
	}
}

// viewOffer delivers ev to vs if its filter accepts it, and files the
// subject as held. A filter is evaluated once per event, by the first view
// that holds it (the others read its result); the evaluation is charged to
// that view's connection (FilterBudget), whose filters together may spend
// HubConfig.MaxConnCost for one event and Config.FilterCostRate over time: the
// view whose evaluation passes either gets this event's result, then ends
// (filter_too_costly), as does each later one of that connection that
// would evaluate a filter while it is past them. So no connection holds
// up the dispatcher for much more than maxConnCost per event, however
// many filters it holds.
func (h *Hub) viewOffer(vs *View, ev *Event, p *filter.Parsed, seq uint64, st *dispatchStats) {
	if vs.ended || vs.matched == seq {
		return
	}
	over := false
	if f := vs.Filter; f.Seq != seq {
		fb := vs.Budget
		if fb != nil {
			if fb.seq != seq {
				fb.seq, fb.event = seq, 0
			}
			if h.maxConnCost > 0 && fb.event > h.maxConnCost || fb.Owed(h.now) > 0 {
				h.endView(vs, CodeFilterTooCostly)
				return
			}
		}
		var errored bool
		var cost uint64
		f.OK, errored, cost = f.Eval(ev.Subject, p)
		f.Seq = seq
		h.filterEvals++
		h.filterCost += cost
		if errored {
			h.filterErrors++
		}
		if fb != nil {
			fb.event += cost
			owed := fb.Charge(h.now, cost) // always: a short-circuit here once let a connection spend without paying
			over = h.maxConnCost > 0 && fb.event > h.maxConnCost || owed > 0
		}
	}
	if vs.Filter.OK {
		vs.matched = seq
		if !p.Delete {
			if _, ok := vs.Held[ev.Subject]; !ok {
				if vs.Full = vs.Lim.full(vs, 0); vs.Full != "" {
					h.endView(vs, CodeViewTooLarge)
					return
				}
				vs.Held[ev.Subject] = struct{}{}
				h.heldAdd(vs, 1)
				h.holders[ev.Subject] = append(h.holders[ev.Subject], vs)
			}
		}
		h.pushView(vs, ev, st)
	}
	if over {
		h.endView(vs, CodeFilterTooCostly)
	}
}

// endView marks vs ended for code: it gets nothing more, and its
// connection ends the subscription after the batch, outside the index lock.
func (h *Hub) endView(vs *View, code string) {
	vs.ended = true
	vs.endCode = code
	h.ending = append(h.ending, vs)
}

// viewTruncate sends a truncate to vs (it carries no row) and forgets the
// documents under its prefix.
func (h *Hub) viewTruncate(vs *View, ev *Event, st *dispatchStats) {
	if vs.ended {
		return
	}
	prefix := ev.Subject[:len(ev.Subject)-len(filter.TruncateToken)]
	for s := range vs.Held {
		if strings.HasPrefix(s, prefix) && !strings.Contains(s[len(prefix):], ".") {
			delete(vs.Held, s)
			h.heldAdd(vs, -1)
			h.dropHolder(s, vs)
		}
	}
	h.pushView(vs, ev, st)
}

// pushView queues ev for vs, through the hub's one delivery path.
func (h *Hub) pushView(vs *View, ev *Event, st *dispatchStats) {
	it := Item{Ev: ev, Subs: vs.Subs}
	h.push(vs.Client, it, it.Size(), st)
}

// FilteredSnapshotScan bounds the subjects a filtered view's snapshot
// reads, in multiples of Config.MaxSnapshot: a where that passes one row
// in ten of a big table still snapshots (1,000,000 subjects by default),
// and no where makes the broker read a pattern of any size.
const FilteredSnapshotScan = 10

// ErrViewTooLarge ends a snapshot or a view past Config.MaxSnapshot
// documents (view_too_large).
var ErrViewTooLarge = errors.New("the view passed --max-snapshot documents")

// KeysBytes is what vs's Keys take in a synced: each subject's JSON and
// a comma.
func (vs *View) KeysBytes() int {
	n := 0
	for s := range vs.Held {
		n += jsonstr.Len(s) + 1
	}
	return n
}

// Keys are the subjects vs holds, sorted (a filtered view's synced).
func (vs *View) Keys() []string {
	out := make([]string, 0, len(vs.Held))
	for s := range vs.Held {
		out = append(out, s)
	}
	slices.Sort(out)
	return out
}
