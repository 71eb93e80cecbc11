package gateway

import (
	"errors"

	"github.com/fanwire/fanwire/gateway/internal/fanout"
	"github.com/fanwire/fanwire/gateway/internal/filter"
	"github.com/fanwire/fanwire/jsonstr"
	"github.com/fanwire/fanwire/subject"
)

// handOver tries to make the subscription live after the watermark w, up
// to which it has replayed: while the index is held for writing (nothing
// is being dispatched), the events dispatched since w, if any, come from
// the hub's recent ring, after the reply, before the subscription goes
// live. It reports whether the resume is over (live, failed, or its
// context done); false: the ring no longer reaches back to w, or the
// queue had no room, and the caller replays again.
func (rs *resumer) handOver(w string) (over bool) {
	c, d, vs, st, id, r := rs.c, rs.d, rs.vs, rs.st, rs.id, rs.r
	// A view's synced lists every subject it holds: one that could never
	// fit the mailbox fails the subscription now; one that does not fit
	// what is free is waited for below (nothing may wait under the
	// index). Measured here, outside the lock: until it is live, only
	// this goroutine changes the view.
	keyed := r.synced && r.delta != "" && c.sendsSynced(id)
	keysBytes := 0
	if keyed {
		keysBytes = vs.KeysBytes()
		if n := c.syncedBytes(id, st.pattern, w, keysBytes); c.cl.NeverFits(n) {
			c.failSubscribe(id, c.s.syncedTooLarge(len(vs.Held), n))
			return true
		}
	}
	var wake, tooLarge bool
	var spent uint64 // filter cost the hand-over spent under the lock
	needFree := 0    // bytes the hand-over would queue, when they were not free
	added := c.s.hub.Locked(func(tx fanout.Tx) bool {
		if rs.ctx.Err() != nil {
			return false
		}
		var gap []*fanout.Event
		if last := c.s.hub.LastCursor(); last != w {
			var ok bool
			if gap, ok = tx.RecentAfter(w, d.CompareCursors); !ok {
				return false
			}
		}
		matching := gap[:0]
		for _, ev := range gap {
			if subject.MatchEvent(st.pattern, ev.Subject) {
				matching = append(matching, ev)
			}
		}
		if len(matching) > c.cl.Mailbox.Room()/2 {
			return false // too big to queue at once: replay it with flow control
		}
		if keyed {
			// What the gap and synced take, at most (each gap event
			// may add its subject to the keys; subscribed went after
			// the snapshot).
			need := c.syncedBytes(id, st.pattern, w, keysBytes)
			for _, ev := range matching {
				need += len(ev.Bytes()) + rs.subs.Size + jsonstr.Len(ev.Subject) + 1
			}
			if need > c.cl.Mailbox.Free() {
				needFree = min(need, c.cl.Mailbox.MaxBytes())
				return false
			}
		}
		// A filtered view's results first, with nothing queued yet:
		// past the connection's share of one event
		// (MaxFilterCostPerEvent), the lock is not held longer: those
		// events are replayed outside it, and the next hand-over's gap
		// is what was dispatched meanwhile.
		var ps []*filter.Parsed
		var oks []bool
		if vs != nil && vs.Filter != nil {
			ps, oks = make([]*filter.Parsed, len(matching)), make([]bool, len(matching))
			for i, ev := range matching {
				ps[i] = ev.ParsedNoKeep()
				if ps[i].Truncate {
					continue
				}
				var cost uint64
				oks[i], cost = vs.Filter.Accepts(ev.Subject, ps[i])
				if spent += cost; c.s.hub.MaxConnCost() > 0 && spent > c.s.hub.MaxConnCost() {
					return false
				}
			}
		}
		wake = rs.reply() || wake
		for i, ev := range matching {
			var p *filter.Parsed
			var ok *bool
			if ps != nil {
				p, ok = ps[i], &oks[i]
			}
			wasEmpty, err := rs.enqueue(ev, p, ok)
			if errors.Is(err, fanout.ErrViewTooLarge) {
				tooLarge = true
				return false
			}
			if err != nil {
				return false // closing with 4008: the next replay round ends this resume
			}
			wake = wake || wasEmpty
		}
		if r.synced {
			var keys []string
			if r.delta != "" {
				keys = vs.Keys()
			}
			wake = c.queueSynced(id, st.pattern, c.s.hub.LastCursor(), keys) || wake
		}
		if vs != nil && vs.Filter != nil {
			tx.AddView(vs)
		} else {
			tx.Add(c.cl, id, st.pattern)
		}
		return true
	})
	if wake {
		c.cl.Signal()
	}
	if tooLarge {
		c.failSubscribe(id, fanout.ErrViewTooLarge)
		return true
	}
	if c.spendFilterCost(rs.ctx, spent) != nil {
		return true // the connection is ending, or the subscription
	}
	if added {
		c.subsMu.Lock()
		st.live = true
		if vs != nil && vs.Filter == nil {
			st.view = nil // an unfiltered snapshot: a plain subscription from here on
		}
		c.subsMu.Unlock()
		if vs != nil && vs.Filter != nil {
			vs.OnEnd = func(code string) { c.viewEnded(id, st, code) }
		}
		c.s.metrics.Subscriptions.Inc()
		return true
	}
	if rs.ctx.Err() != nil {
		return true
	}
	if needFree > 0 { // the view's synced waits for the client to read
		c.cl.Signal()
		if err := c.waitForClient(st, func() error { return c.cl.Mailbox.WaitFree(rs.ctx, needFree) }); err != nil {
			return true
		}
	}
	return false
}
