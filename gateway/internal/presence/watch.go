package presence

import (
	"math"
	"slices"
	"strconv"

	"github.com/fanwire/fanwire/gateway/internal/fanout"
	"github.com/fanwire/fanwire/jsonstr"
	"github.com/fanwire/fanwire/subject"
)

// Presence delivery: the subscriptions that watch presence ("presence":
// true), and how a subject's changes reach them, at once in a small
// subject, coalesced per interval in a big one (presence.go has the
// replica they come from).

// Change is a member's coalesced change since a room's last
// delivery.
type Change struct {
	Op  byte   // opJoin, opUpdate, opLeave
	Enc []byte // the member (a leave: {"conn":…[,"sub":…]})
}

const (
	OpJoin   = 'j'
	OpUpdate = 'u'
	OpLeave  = 'l'
)

// presenceWatch is a subscription with "presence": it gets the changes of
// the subjects pattern matches.
type presenceWatch struct {
	c       *Conn
	id      string
	pattern string
	subs    *fanout.SubsList // its id alone, encoded for its connection
}

// emitLocked delivers a member's change to the room's watchers: at once
// in a small room, at the next tick (coalesced) in a big one or one with
// changes already waiting (they keep their order).
func (p *Presence) emitLocked(r *room, conn string, op byte, enc []byte) {
	if len(r.pend) == 0 && len(r.members) <= p.listLimit {
		p.deliverLocked(r, []Change{{Op: op, Enc: enc}})
		return
	}
	if r.pend == nil {
		r.pend = make(map[string]Change)
	}
	prev, had := r.pend[conn]
	switch {
	case !had:
		r.pend[conn] = Change{Op: op, Enc: enc}
	case prev.Op == OpJoin && op == OpLeave:
		delete(r.pend, conn) // came and went within the interval
	case prev.Op == OpJoin:
		r.pend[conn] = Change{Op: OpJoin, Enc: enc}
	case prev.Op == OpLeave && op == OpJoin:
		r.pend[conn] = Change{Op: OpUpdate, Enc: enc}
	default:
		r.pend[conn] = Change{Op: op, Enc: enc}
	}
	p.dirty[r] = struct{}{}
}

// flushLocked delivers every room's coalesced changes: at most
// p.flushBytes of a room's at a time (its watchers' mailboxes must hold
// them at once); the rest stays coalesced for the next tick, which starts
// after the last member this one delivered, so that a room whose changes
// keep passing the cap still delivers every member's in turn.
func (p *Presence) flushLocked() {
	var more []*room
	for r := range p.dirty {
		delete(p.dirty, r)
		if len(r.pend) == 0 {
			continue
		}
		keys := make([]string, 0, len(r.pend))
		for k := range r.pend {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		if r.resumeAfter != "" {
			i, found := slices.BinarySearch(keys, r.resumeAfter)
			if found {
				i++
			}
			keys = slices.Concat(keys[i:], keys[:i])
			r.resumeAfter = ""
		}
		limit := p.flushBytes
		if !p.watchedLocked(r.subject) {
			limit = math.MaxInt // nobody to pace for: forget them all
		}
		changes := make([]Change, 0, len(keys))
		size := 0
		for i, k := range keys {
			ch := r.pend[k]
			if size += len(ch.Enc) + 1; i > 0 && size > limit {
				r.resumeAfter = keys[i-1]
				break
			}
			changes = append(changes, ch)
			delete(r.pend, k)
		}
		if len(r.pend) == 0 {
			r.pend = nil
		} else {
			more = append(more, r)
		}
		p.deliverLocked(r, changes)
		if len(r.members) == 0 && r.pend == nil {
			delete(p.rooms, r.subject)
		}
	}
	for _, r := range more { // after the loop, which could visit them again
		p.dirty[r] = struct{}{}
	}
}

// watchedLocked reports whether a subscription watches subject.
func (p *Presence) watchedLocked(subj string) bool {
	if len(p.exact[subj]) > 0 {
		return true
	}
	for _, w := range p.wild {
		if subject.Match(w.pattern, subj) {
			return true
		}
	}
	return false
}

// NewEvent builds the shared message of changes to r:
//
//	{"type":"presence","subject":…,"subs":[…],"count":N[,"joins":[…]][,"leaves":[…]][,"updates":[…]]}
//
// Its data (what GraphQL splices) is the part after "subs", from "count"
// on, without the closing brace.
func NewEvent(subject string, count int, changes []Change) *fanout.Event {
	n := 48
	for _, c := range changes {
		n += len(c.Enc) + 1
	}
	return fanout.NewFields(fanout.KindPresence, presencePrefix, subject, n, func(buf []byte) []byte {
		buf = append(buf, `"count":`...)
		buf = strconv.AppendInt(buf, int64(count), 10)
		for _, kind := range []struct {
			op   byte
			name string
		}{{OpJoin, `,"joins":[`}, {OpLeave, `,"leaves":[`}, {OpUpdate, `,"updates":[`}} {
			first := true
			for _, c := range changes {
				if c.Op != kind.op {
					continue
				}
				if first {
					buf = append(buf, kind.name...)
					first = false
				} else {
					buf = append(buf, ',')
				}
				buf = append(buf, c.Enc...)
			}
			if !first {
				buf = append(buf, ']')
			}
		}
		return buf
	})
}

const presencePrefix = `{"type":"presence","subject":`

// deliverLocked queues changes to r to every subscription watching it: one
// message, or several of at most p.pieceBytes each (split by member, each
// with the room's count; presenceCuts), each built once and shared by
// every watcher. A piece one watcher's mailbox could never hold (a single
// member's change, --max-presence-state near --mailbox-bytes) is not
// queued to it and is counted (reason too_large).
func (p *Presence) deliverLocked(r *room, changes []Change) {
	group := p.scratch
	for _, w := range p.exact[r.subject] {
		group[w.c] = append(group[w.c], w)
	}
	for _, w := range p.wild {
		if subject.Match(w.pattern, r.subject) {
			group[w.c] = append(group[w.c], w)
		}
	}
	if len(group) == 0 {
		return
	}
	parts := false
	for c := range group {
		if c.Parts && p.cfg.Parts != nil {
			parts = true
			break
		}
	}
	evs := p.evs[:0]
	p.cuts = presenceCuts(p.cuts[:0], r.subject, changes, p.pieceBytes)
	start := 0
	for _, end := range p.cuts {
		ev := NewEvent(r.subject, len(r.members), changes[start:end])
		if parts { // encoded once for every watcher that takes them
			ev.Ext = p.cfg.Parts(len(r.members), changes[start:end])
		}
		evs = append(evs, ev)
		start = end
	}
	for c, ws := range group {
		subs := ws[0].subs
		if len(ws) > 1 {
			ids := make([]string, len(ws))
			for i, w := range ws {
				ids[i] = w.id
			}
			slices.Sort(ids)
			ids = slices.Compact(ids)
			subs = c.Client.SubsFor(ids)
		}
		clear(ws)
		delete(group, c)
		for _, ev := range evs {
			n := len(ev.Bytes()) + subs.Size
			if c.Client.NeverFits(n) {
				p.m.dropped.WithLabelValues(presDropTooLarge).Inc()
				continue
			}
			wasEmpty, _, err := c.Client.Mailbox.Push(fanout.Item{Ev: ev, Subs: subs}, n)
			if err != nil {
				if c.Client.Overflowed.CompareAndSwap(false, true) {
					p.ovf = append(p.ovf, c)
				}
				break
			}
			p.m.delivered.Inc()
			if wasEmpty {
				p.wakes = append(p.wakes, c)
			}
		}
	}
	clear(evs)
	p.evs = evs[:0]
}

// presenceCuts appends to cuts where changes are cut into runs whose
// presence message (without its subs) takes at most max bytes, one change
// at least: the end of each run, the last len(changes). Each change is one
// member's, coalesced, so any cut is sound.
func presenceCuts(cuts []int, subject string, changes []Change, max int) []int {
	fixed := len(presencePrefix) + jsonstr.Len(subject) + len(fanout.SubsField) + len(`,"count":,"joins":[],"leaves":[],"updates":[]}`) + 20
	size := fixed
	for i, c := range changes {
		if n := len(c.Enc) + 1; i > 0 && size+n > max {
			cuts = append(cuts, i)
			size = fixed
		}
		size += len(c.Enc) + 1
	}
	return append(cuts, len(changes))
}

// unlock releases mu, then wakes the writers of the connections it
// queued to and closes those that overflowed.
func (p *Presence) unlock() {
	wakes, ovf := p.wakes, p.ovf
	p.wakes, p.ovf = nil, nil
	p.mu.Unlock()
	for _, c := range wakes {
		c.Client.Signal()
	}
	for _, c := range ovf {
		c.Client.OnOverflow()
	}
}

// watchLocked makes subscription id of c (on pattern) get presence
// changes. The caller holds mu.
func (p *Presence) watchLocked(c *Conn, id, pattern string) {
	w := &presenceWatch{c: c, id: id, pattern: pattern, subs: c.Client.SubsFor([]string{id})}
	p.watches[c] = append(p.watches[c], w)
	if isConcrete(pattern) {
		p.exact[pattern] = append(p.exact[pattern], w)
	} else {
		p.wild = append(p.wild, w)
	}
}

// Watch is watchLocked taking mu.
func (p *Presence) Watch(c *Conn, id, pattern string) {
	p.mu.Lock()
	p.watchLocked(c, id, pattern)
	p.mu.Unlock()
}

// Unwatch stops subscription id of c getting presence changes: no
// message queued after it returns lists id.
func (p *Presence) Unwatch(c *Conn, id string) {
	p.mu.Lock()
	ws := p.watches[c]
	for i, w := range ws {
		if w.id == id {
			p.unwatchLocked(w)
			ws = slices.Delete(ws, i, i+1)
			break
		}
	}
	if len(ws) == 0 {
		delete(p.watches, c)
	} else {
		p.watches[c] = ws
	}
	p.mu.Unlock()
}

func (p *Presence) unwatchLocked(w *presenceWatch) {
	if isConcrete(w.pattern) {
		ws := p.exact[w.pattern]
		if i := slices.Index(ws, w); i >= 0 {
			ws = slices.Delete(ws, i, i+1)
		}
		if len(ws) == 0 {
			delete(p.exact, w.pattern)
		} else {
			p.exact[w.pattern] = ws
		}
		return
	}
	if i := slices.Index(p.wild, w); i >= 0 {
		p.wild = slices.Delete(p.wild, i, i+1)
	}
}

// isConcrete reports whether a valid pattern has no wildcard.
func isConcrete(pattern string) bool {
	for i := 0; i < len(pattern); i++ {
		if (pattern[i] == '*' || pattern[i] == '>') && (i == 0 || pattern[i-1] == '.') && (i+1 == len(pattern) || pattern[i+1] == '.') {
			return false
		}
	}
	return true
}

// Flush delivers the coalesced changes now, as the interval's tick does.
func (p *Presence) Flush() {
	p.mu.Lock()
	p.flushLocked()
	p.unlock()
}
