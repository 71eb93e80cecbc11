package fanout

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/fanwire/fanwire/gateway/internal/filter"
)

// FilterBudget is what one connection's filtered subscriptions may spend
// and hold. They hold documents (view.go): held counts those filed in the
// view index, bounded by Config.MaxViewDocumentsPerConnection besides each
// view's MaxSnapshot and the node's MaxViewDocuments (HeldLimits). Their
// filters spend CEL cost units as the filter package prices them: per event in the dispatcher
// (Config.MaxFilterCostPerEvent), and over time wherever they are
// evaluated (Config.FilterCostRate, in bursts of a second's worth). The
// dispatcher, which may not wait, ends a view whose connection is past
// either (filter_too_costly); a snapshot, replay or feed, on the
// connection's own goroutine, waits until the rate has paid for what it
// spent. An evaluation is charged what it cost, however far past the
// limits: one operation over a big event can cost more than the limit it
// is stopped at (an equality of two large lists compares them first), and
// the connection pays that debt before its filters run again.
type FilterBudget struct {
	// Owned by the dispatcher: what the connection's views spent on event
	// seq.
	seq, event uint64

	rate float64 // static: units per second, and the burst

	mu sync.Mutex
	b  filter.Bucket // guarded by mu

	held atomic.Int64 // documents the connection's views hold in the view index
}

// HeldLimits bound the documents views hold: per connection and per node
// (each view has its own, View.Max). Static (HubConfig), but node.
type HeldLimits struct {
	perConn, perNode int64
	node             *atomic.Int64 // the node's count (hub.held)
}

// full says which bound vs would pass by holding one more document (""
// none): its own max, its connection's, or the node's. unfiled is how
// many of its documents the counts do not include yet (a snapshot's, a
// replay's: all of them; in the index: none). The node's bound is checked
// as documents are added, so snapshots in flight may pass it by their own
// sizes.
func (l *HeldLimits) full(vs *View, unfiled int) string {
	switch {
	case len(vs.Held) >= vs.Max:
		return FullView
	case l == nil:
		return ""
	case l.perConn > 0 && vs.Budget != nil && vs.Budget.held.Load()+int64(unfiled) >= l.perConn:
		return FullConn
	case l.perNode > 0 && l.node.Load()+int64(unfiled) >= l.perNode:
		return FullNode
	}
	return ""
}

// The bounds a view can pass (View.Full).
const (
	FullView = "view"
	FullConn = "connection"
	FullNode = "node"
	FullScan = "scan" // a filtered snapshot's pattern covers more subjects than it may read (FilteredSnapshotScan)
)

// NewFilterBudget is a budget of rate units per second (0: no bound).
func NewFilterBudget(rate int) *FilterBudget {
	return &FilterBudget{rate: float64(rate)}
}

// Charge takes cost units at now, in debt if need be, and says how long
// until the debt is paid (0: none).
func (fb *FilterBudget) Charge(now time.Time, cost uint64) time.Duration {
	if fb == nil || fb.rate <= 0 {
		return 0
	}
	fb.mu.Lock()
	defer fb.mu.Unlock()
	fb.b.Take(now, fb.rate, fb.rate, float64(cost), true)
	return fb.b.Wait(fb.rate)
}

// Owed is how long until past spending is paid for (0: it is).
func (fb *FilterBudget) Owed(now time.Time) time.Duration {
	return fb.Charge(now, 0)
}
