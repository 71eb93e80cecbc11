package gateway

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/fanwire/fanwire/gateway/internal/filter"
	"github.com/fanwire/fanwire/jsonstr"

	"github.com/fanwire/fanwire/broker"
	"github.com/fanwire/fanwire/subject"
	"go.uber.org/zap"
)

// startResume begins a subscription that first replays history from a
// cursor ("first": everything retained), or reads the newest event of each
// subject ("latest"), then continues live; f (nil: none) filters it.
func (c *conn) startResume(id, pattern, from string, f *filter.Filter) {
	d := c.s.durable
	if d == nil {
		c.clientError(id, CodeBadCursor, "this gateway's broker keeps no history: subscribe without \"from\"")
		return
	}
	r := resumeSpec{synced: true}
	switch from {
	case "first":
	case "latest":
		if c.s.snapshots == nil {
			c.clientError(id, CodeBadCursor, "this gateway's broker cannot read each subject's newest event: subscribe without \"from\":\"latest\"")
			return
		}
		r.latest = true
	default:
		if _, err := d.CompareCursors(from, from); err != nil {
			c.clientError(id, CodeBadCursor, err.Error())
			return
		}
		r.after = from
		if f != nil && c.s.snapshots != nil {
			// A filtered view's resume: the client's documents that
			// changed since its cursor, then the list of those it holds
			// (leaves it missed while away cannot be replayed: the node
			// did not track what that client held).
			r.latest, r.delta = true, from
		}
	}
	st := &subState{pattern: pattern}
	if f != nil || r.latest {
		st.view = c.newViewSub(id, pattern, f)
	}
	if ctx, ok := c.startTask(id, st); ok {
		go c.resume(ctx, id, st, r)
	}
}

// resumeSpec is where a resume starts.
type resumeSpec struct {
	after  string // replay after this cursor ("" from the first retained)
	latest bool   // first read each subject's newest event (broker.Snapshots), then replay after it
	delta  string // with latest: the client's cursor; documents at or before it are held but not sent, and synced lists the keys
	synced bool   // send synced at the hand-over
}

// startTask registers the subscription st, served by a goroutine the caller
// starts with the returned context when ok (then it must call c.tasks.Done
// and close st.task.done when it exits). It fails when the connection is
// ending.
func (c *conn) startTask(id string, st *subState) (ctx context.Context, ok bool) {
	ctx, cancel := context.WithCancel(c.runCtx)
	st.task = &taskState{cancel: cancel, done: make(chan struct{})}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		cancel()
		return nil, false
	}
	c.tasks.Add(1)
	c.mu.Unlock()
	c.subsMu.Lock()
	c.subs[id] = st
	c.subsMu.Unlock()
	return ctx, true
}

// resume replays the subscription's history, then hands it over to the live
// feed without a gap or a duplicate: it replays up to the cursor of the last
// event the dispatcher has dispatched (the watermark), then, holding the
// index for writing (nothing can be dispatched meanwhile), adds the
// subscription if the watermark has not moved, or replays the difference
// and tries again. The "subscribed" reply, carrying the cursor the
// subscription starts after, precedes every event for it.
func (c *conn) resume(ctx context.Context, id string, st *subState, r resumeSpec) {
	defer c.tasks.Done()
	defer close(st.task.done)
	defer st.task.cancel()
	d := c.s.durable
	after := r.after
	vs := st.view
	subs := c.cl.subsFor([]string{id})
	filters := c.s.replayFilters(st.pattern)
	replied := false
	reply := func() bool { // queues "subscribed" once; reports whether to wake
		if replied {
			return false
		}
		replied = true
		cursor := after
		if r.latest {
			cursor = r.delta
		}
		return c.queue(c.subscribedMsg(id, cursor))
	}
	// enqueue queues one event for this subscription, whose filter's
	// result (nil: evaluate it) is ok; a full mailbox closes the
	// connection with 4008.
	enqueue := func(ev *Event, p *filter.Parsed, ok *bool) (wasEmpty bool, err error) {
		if vs != nil {
			if p == nil {
				p = viewParse(vs, ev)
			}
			var deliver, leave, tooLarge bool
			if ok != nil {
				deliver, leave, tooLarge = vs.apply(ev.Subject, p, *ok)
			} else {
				deliver, leave, tooLarge, _ = vs.offer(ev.Subject, p)
			}
			switch {
			case tooLarge:
				return false, errViewTooLarge
			case leave:
				ev = leaveEvent(ev)
			case !deliver:
				return false, nil
			}
		}
		it := item{ev: ev, subs: subs}
		if c.cl.neverFits(it.size()) { // skipped, as live
			return false, nil
		}
		wasEmpty, _, err = c.cl.mb.push(it, it.size())
		if err != nil {
			c.overflow()
		}
		return wasEmpty, err
	}
	var through string // cursor of the last message of the last batch this replay handed to deliver
	deliver := func(ms []broker.Message) error {
		if reply() {
			c.cl.signal()
		}
		if err := c.queueEvents(ctx, ms, st.pattern, subs, vs); err != nil {
			return err
		}
		if len(ms) > 0 {
			through = ms[len(ms)-1].Cursor
		}
		return nil
	}
	// replay runs Replay and sorts its failures. A cursor the broker
	// refuses ends the resume with an error for the client (stop). A failed
	// broker (a failover, a restart) is waited out while the connection
	// lives, as the live feed waits it out: replay reports !done and the
	// caller goes on after through, the last message replayed.
	retryWait := resumeRetryMin
	replay := func(after, until string) (done, stop bool) {
		through = after
		err := d.Replay(ctx, filters, after, until, deliver)
		switch {
		case err == nil:
			retryWait = resumeRetryMin
			return true, false
		case ctx.Err() != nil, errors.Is(err, ErrMailboxFull):
			return false, true
		case errors.Is(err, errViewTooLarge):
			c.failSubscribe(id, err)
			return false, true
		case subscribeErrorCode(err) != CodeBrokerUnavailable, // the cursor cannot work
			errors.Is(err, broker.ErrUnsupported): // nor can the broker, however long we wait
			c.failSubscribe(id, err)
			return false, true
		}
		if retryWait == resumeRetryMin {
			c.s.log.Warn("resume: the broker failed to replay; retrying", zap.String("connection", c.id), zap.Error(err))
		}
		select {
		case <-ctx.Done():
			return false, true
		case <-time.After(retryWait):
		}
		retryWait = min(2*retryWait, resumeRetryMax)
		return false, false
	}
	pos := after
	validated := false
	if vs != nil && vs.f != nil {
		vs.onEnd = func(code string) { c.viewEnded(id, st, code) }
	}
	if r.latest {
		// The snapshot: each subject's newest event (at or before
		// through), then the loop below replays after through and hands
		// over, as any resume. A filtered view's resume (delta) holds the
		// documents at or before the client's cursor without sending them.
		var deltaErr error
		limit := c.s.cfg.MaxSnapshot
		if vs != nil && vs.f != nil {
			// A filtered view counts the documents its filter passes,
			// which the broker cannot tell; the subjects it reads are
			// bounded still, at filteredSnapshotScan times its bound.
			limit = filteredSnapshotScan * c.s.cfg.MaxSnapshot
		}
		through, err := c.s.snapshots.Latest(ctx, filters, limit, func(ms []broker.Message) error {
			if r.delta != "" {
				k := 0
				for _, m := range ms {
					if o, err := d.CompareCursors(m.Cursor, r.delta); err != nil || o > 0 {
						ms[k] = m
						k++
						continue
					}
					if !subject.MatchEvent(st.pattern, m.Subject) {
						continue
					}
					ev, err := c.s.event(m)
					if err != nil {
						continue
					}
					_, _, tooLarge, cost := vs.offer(ev.Subject, viewParse(vs, ev))
					if tooLarge {
						return errViewTooLarge
					}
					if err := c.spendFilterCost(ctx, cost); err != nil {
						return err
					}
				}
				ms = ms[:k]
				if k == 0 {
					return nil // nothing to send: no "subscribed" before a cursor is known to be good
				}
			}
			return deliver(ms)
		})
		if err == nil && r.delta != "" && through != "" {
			if o, cerr := d.CompareCursors(r.delta, through); cerr != nil {
				err = cerr
			} else if o > 0 {
				deltaErr = fmt.Errorf("%w: %s is ahead of the stream (its last event is %s)", broker.ErrBadCursor, r.delta, through)
			}
		}
		if err == nil {
			err = deltaErr
		}
		if errors.Is(err, broker.ErrSnapshotTooLarge) {
			if vs != nil && vs.f != nil {
				vs.full = fullScan
			}
			if reply() { // subscribed, then the error, as when the documents passed the bound here
				c.cl.signal()
			}
			err = errViewTooLarge
		}
		switch {
		case err == nil:
		case ctx.Err() != nil, errors.Is(err, ErrMailboxFull):
			return
		default:
			c.failSubscribe(id, err)
			return
		}
		if reply() {
			c.cl.signal()
		}
		pos, validated = through, true
	}
	for {
		w := c.s.hub.lastCursor() // the watermark: last event dispatched live
		ahead := false
		if pos != "" && pos != w {
			if w == "" { // nothing dispatched yet: the live feed starts before pos
				ahead = true
			} else if order, err := d.CompareCursors(pos, w); err == nil && order > 0 {
				ahead = true
			}
		}
		if ahead {
			// The client's cursor is ahead of this node's live feed. If it
			// is within the stream (it came from a node further along, or
			// this node has not dispatched that far yet), wait for ours; if
			// it is ahead of the stream, it is a bad cursor.
			if !validated {
				done, stop := replay(pos, pos)
				if stop {
					return
				}
				validated = done
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Millisecond):
			}
			continue
		}
		if w != "" { // replay (pos, w]; pos == "" replays from the first retained
			done, stop := replay(pos, w)
			if stop {
				return
			}
			if !done {
				pos = through
				continue
			}
			pos = w
		}
		// A view's synced lists every subject it holds: one that could
		// never fit the mailbox fails the subscription now; one that does
		// not fit what is free is waited for below (nothing may wait under
		// the index). Measured here, outside the lock: until it is live,
		// only this goroutine changes the view.
		keyed := r.synced && r.delta != "" && c.sendsSynced(id)
		keysBytes := 0
		if keyed {
			keysBytes = vs.keysBytes()
			if n := c.syncedBytes(id, st.pattern, w, keysBytes); c.cl.neverFits(n) {
				c.failSubscribe(id, c.s.syncedTooLarge(len(vs.held), n))
				return
			}
		}
		// Hand over while the index is held for writing (nothing is being
		// dispatched): the events dispatched since w, if any, come from the
		// hub's recent ring, after the reply, before the subscription goes
		// live. Only if the ring no longer reaches back to w, replay again.
		var wake, tooLarge bool
		var spent uint64 // filter cost the hand-over spent under the lock
		needFree := 0    // bytes the hand-over would queue, when they were not free
		added := c.s.hub.handover(
			func() bool {
				if ctx.Err() != nil {
					return false
				}
				var gap []*Event
				if last := c.s.hub.lastCursor(); last != w {
					var ok bool
					if gap, ok = c.s.hub.recent.after(w, d.CompareCursors); !ok {
						return false
					}
				}
				matching := gap[:0]
				for _, ev := range gap {
					if subject.MatchEvent(st.pattern, ev.Subject) {
						matching = append(matching, ev)
					}
				}
				if len(matching) > c.cl.mb.room()/2 {
					return false // too big to queue at once: replay it with flow control
				}
				if keyed {
					// What the gap and synced take, at most (each gap
					// event may add its subject to the keys; subscribed
					// went after the snapshot).
					need := c.syncedBytes(id, st.pattern, w, keysBytes)
					for _, ev := range matching {
						need += len(ev.buf) + subs.size + jsonstr.Len(ev.Subject) + 1
					}
					if need > c.cl.mb.free() {
						needFree = min(need, c.cl.mb.maxBytes)
						return false
					}
				}
				// A filtered view's results first, with nothing queued
				// yet: past the connection's share of one event
				// (MaxFilterCostPerEvent), the lock is not held longer:
				// those events are replayed outside it, and the next
				// hand-over's gap is what was dispatched meanwhile.
				var ps []*filter.Parsed
				var oks []bool
				if vs != nil && vs.f != nil {
					ps, oks = make([]*filter.Parsed, len(matching)), make([]bool, len(matching))
					for i, ev := range matching {
						ps[i] = viewParse(vs, ev)
						if ps[i].Truncate {
							continue
						}
						var cost uint64
						oks[i], cost = vs.f.Accepts(ev.Subject, ps[i])
						if spent += cost; c.s.hub.maxConnCost > 0 && spent > c.s.hub.maxConnCost {
							return false
						}
					}
				}
				wake = reply() || wake
				for i, ev := range matching {
					var p *filter.Parsed
					var ok *bool
					if ps != nil {
						p, ok = ps[i], &oks[i]
					}
					wasEmpty, err := enqueue(ev, p, ok)
					if errors.Is(err, errViewTooLarge) {
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
						keys = vs.keys()
					}
					wake = c.queueSynced(id, st.pattern, c.s.hub.lastCursor(), keys) || wake
				}
				return true
			}, func() {
				if vs != nil && vs.f != nil {
					c.s.hub.addViewLocked(vs)
				} else {
					c.s.hub.idx.addLocked(c.cl, id, st.pattern)
				}
			})
		if wake {
			c.cl.signal()
		}
		if tooLarge {
			c.failSubscribe(id, errViewTooLarge)
			return
		}
		if c.spendFilterCost(ctx, spent) != nil {
			return // the connection is ending, or the subscription
		}
		if added {
			c.subsMu.Lock()
			st.live = true
			if vs != nil && vs.f == nil {
				st.view = nil // an unfiltered snapshot: a plain subscription from here on
			}
			c.subsMu.Unlock()
			if vs != nil && vs.f != nil {
				vs.onEnd = func(code string) { c.viewEnded(id, st, code) }
			}
			c.s.metrics.Subscriptions.Inc()
			return
		}
		if ctx.Err() != nil {
			return
		}
		if needFree > 0 { // the view's synced waits for the client to read
			c.cl.signal()
			if err := c.cl.mb.waitFree(ctx, needFree); err != nil {
				return
			}
		}
	}
}

// resumeRetryMin and resumeRetryMax space a resume's attempts to replay
// while the broker fails over (a NATS leader election takes about 2 s).
const (
	resumeRetryMin = 50 * time.Millisecond
	resumeRetryMax = time.Second
)

// queueEvents queues the messages of ms that match pattern as events of
// one subscription (subs), waiting while the mailbox is over half full: a
// replay or a feed is one connection's producer and may wait for its
// writer, unlike the dispatcher. It wakes the writer once per batch, not
// per event (a wake per event made a frame per event: 45k events/s of
// catch-up). A push that fails anyway closes the connection with 4008. An
// event that could not fit even in an empty mailbox is skipped, as live.
func (c *conn) queueEvents(ctx context.Context, ms []broker.Message, pattern string, subs *subsList, vs *viewSub) error {
	wake := false
	defer func() {
		if wake {
			c.cl.signal()
		}
	}()
	for _, m := range ms {
		if !subject.MatchEvent(pattern, m.Subject) {
			continue
		}
		ev, err := c.s.event(m)
		if err != nil {
			c.s.metrics.EventsInvalid.Inc()
			continue
		}
		if vs != nil {
			deliver, leave, tooLarge, cost := vs.offer(ev.Subject, viewParse(vs, ev))
			if err := c.spendFilterCost(ctx, cost); err != nil {
				return err
			}
			switch {
			case tooLarge:
				return errViewTooLarge
			case leave:
				ev = leaveEvent(ev)
			case !deliver:
				continue
			}
		}
		it := item{ev: ev, subs: subs}
		if c.cl.neverFits(it.size()) { // skipped, as live (Server.dispatch)
			c.s.metrics.EventsDropped.WithLabelValues(dropTooLarge).Inc()
			continue
		}
		if c.cl.mb.overHalf() {
			if wake {
				c.cl.signal()
				wake = false
			}
			if err := c.cl.mb.waitRoom(ctx); err != nil {
				return err
			}
		}
		wasEmpty, _, err := c.cl.mb.push(it, it.size())
		if err != nil {
			c.overflow()
			return err
		}
		wake = wake || wasEmpty
	}
	return ctx.Err()
}
