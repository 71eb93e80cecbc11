package gateway

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/fanwire/fanwire/gateway/internal/fanout"
	"github.com/fanwire/fanwire/gateway/internal/filter"

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
	rs := &resumer{c: c, ctx: ctx, id: id, st: st, r: r, d: c.s.durable, vs: st.view,
		subs: c.cl.SubsFor([]string{id}), filters: c.s.replayFilters(st.pattern), retryWait: resumeRetryMin}
	rs.run()
}

// resumer is one resume's state. Its goroutine (conn.resume) alone uses it.
type resumer struct {
	c       *conn
	ctx     context.Context
	id      string
	st      *subState
	r       resumeSpec
	d       broker.Durable
	vs      *fanout.View // nil: a plain subscription
	subs    *fanout.SubsList
	filters []string // what the broker replays (Server.replayFilters)

	replied   bool          // "subscribed" is queued
	through   string        // cursor of the last message of the last batch a replay handed to deliver
	retryWait time.Duration // before the next replay, while the broker fails
}

func (rs *resumer) run() {
	c := rs.c
	pos := rs.r.after
	validated := false
	if vs := rs.vs; vs != nil && vs.Filter != nil {
		vs.OnEnd = func(code string) { c.viewEnded(rs.id, rs.st, code) }
	}
	if rs.r.latest {
		last, ok := rs.snapshot()
		if !ok {
			return
		}
		pos, validated = last, true
	}
	for {
		w := c.s.hub.LastCursor() // the watermark: last event dispatched live
		ahead := false
		if pos != "" && pos != w {
			if w == "" { // nothing dispatched yet: the live feed starts before pos
				ahead = true
			} else if order, err := rs.d.CompareCursors(pos, w); err == nil && order > 0 {
				ahead = true
			}
		}
		if ahead {
			// The client's cursor is ahead of this node's live feed. If it
			// is within the stream (it came from a node further along, or
			// this node has not dispatched that far yet), wait for ours; if
			// it is ahead of the stream, it is a bad cursor.
			if !validated {
				done, stop := rs.replay(pos, pos)
				if stop {
					return
				}
				validated = done
			}
			select {
			case <-rs.ctx.Done():
				return
			case <-time.After(time.Millisecond):
			}
			continue
		}
		if w != "" { // replay (pos, w]; pos == "" replays from the first retained
			done, stop := rs.replay(pos, w)
			if stop {
				return
			}
			if !done {
				pos = rs.through
				continue
			}
			pos = w
		}
		if rs.handOver(w) {
			return
		}
	}
}

// reply queues "subscribed" once; it reports whether to wake the writer.
func (rs *resumer) reply() bool {
	if rs.replied {
		return false
	}
	rs.replied = true
	cursor := rs.r.after
	if rs.r.latest {
		cursor = rs.r.delta
	}
	return rs.c.queue(rs.c.subscribedMsg(rs.id, cursor))
}

// enqueue queues one event for this subscription (conn.push), whose
// filter's result (nil: evaluate it) is ok.
func (rs *resumer) enqueue(ev *fanout.Event, p *filter.Parsed, ok *bool) (wasEmpty bool, err error) {
	c, vs := rs.c, rs.vs
	if vs != nil {
		if p == nil {
			p = ev.ParsedNoKeep()
		}
		var deliver, leave, tooLarge bool
		if ok != nil {
			deliver, leave, tooLarge = vs.Apply(ev.Subject, p, *ok)
		} else {
			deliver, leave, tooLarge, _ = vs.Offer(ev.Subject, p)
		}
		switch {
		case tooLarge:
			return false, fanout.ErrViewTooLarge
		case leave:
			ev = fanout.NewLeave(ev)
		case !deliver:
			return false, nil
		}
	}
	return c.push(fanout.Item{Ev: ev, Subs: rs.subs})
}

// push queues it outside the dispatcher (a replay, a hand-over) and
// reports whether the mailbox was empty. A delivery that could never fit
// the mailbox is skipped and counted, as live (Server.dispatch); a full
// mailbox closes the connection with 4008.
func (c *conn) push(it fanout.Item) (wasEmpty bool, err error) {
	if c.cl.NeverFits(it.Size()) {
		c.s.metrics.EventsDropped.WithLabelValues(dropTooLarge).Inc()
		return false, nil
	}
	wasEmpty, _, err = c.cl.Mailbox.Push(it, it.Size())
	if err != nil {
		c.overflow()
	}
	return wasEmpty, err
}

// deliver queues a batch a replay or a snapshot read, after "subscribed".
func (rs *resumer) deliver(ms []broker.Message) error {
	if rs.reply() {
		rs.c.cl.Signal()
	}
	if err := rs.c.queueEvents(rs.ctx, ms, rs.st, rs.subs, rs.vs); err != nil {
		return err
	}
	if len(ms) > 0 {
		rs.through = ms[len(ms)-1].Cursor
	}
	return nil
}

// replay runs Replay and sorts its failures. A cursor the broker refuses
// ends the resume with an error for the client (stop). A failed broker (a
// failover, a restart) is waited out while the connection lives, as the
// live feed waits it out: replay reports !done and the caller goes on
// after rs.through, the last message replayed.
func (rs *resumer) replay(after, until string) (done, stop bool) {
	c := rs.c
	rs.through = after
	err := rs.d.Replay(rs.ctx, rs.filters, after, until, rs.deliver)
	switch {
	case err == nil:
		rs.retryWait = resumeRetryMin
		return true, false
	case rs.ctx.Err() != nil, errors.Is(err, ErrMailboxFull):
		return false, true
	case errors.Is(err, fanout.ErrViewTooLarge):
		c.failSubscribe(rs.id, err)
		return false, true
	case subscribeErrorCode(err) != CodeBrokerUnavailable, // the cursor cannot work
		errors.Is(err, broker.ErrUnsupported): // nor can the broker, however long we wait
		c.failSubscribe(rs.id, err)
		return false, true
	}
	if rs.retryWait == resumeRetryMin {
		c.s.log.Warn("resume: the broker failed to replay; retrying", zap.String("connection", c.id), zap.Error(err))
	}
	select {
	case <-rs.ctx.Done():
		return false, true
	case <-time.After(rs.retryWait):
	}
	rs.retryWait = min(2*rs.retryWait, resumeRetryMax)
	return false, false
}

// snapshot reads each subject's newest event (at or before the cursor it
// returns), as the resume's start; the loop then replays after that
// cursor and hands over, as any resume. A filtered view's resume (delta)
// holds the documents at or before the client's cursor without sending
// them. ok is false when the resume is over (failed, or its context done).
func (rs *resumer) snapshot() (last string, ok bool) {
	c, d, vs, r := rs.c, rs.d, rs.vs, rs.r
	var deltaErr error
	limit := c.s.cfg.MaxSnapshot
	if vs != nil && vs.Filter != nil {
		// A filtered view counts the documents its filter passes, which
		// the broker cannot tell; the subjects it reads are bounded still,
		// at fanout.FilteredSnapshotScan times its bound.
		limit = fanout.FilteredSnapshotScan * c.s.cfg.MaxSnapshot
	}
	last, err := c.s.snapshots.Latest(rs.ctx, rs.filters, limit, func(ms []broker.Message) error {
		if r.delta != "" {
			k := 0
			for _, m := range ms {
				if o, err := d.CompareCursors(m.Cursor, r.delta); err != nil || o > 0 {
					ms[k] = m
					k++
					continue
				}
				if !subject.MatchEvent(rs.st.pattern, m.Subject) {
					continue
				}
				ev, err := c.s.event(m)
				if err != nil {
					continue
				}
				_, _, tooLarge, cost := vs.Offer(ev.Subject, ev.ParsedNoKeep())
				if tooLarge {
					return fanout.ErrViewTooLarge
				}
				if err := c.spendFilterCost(rs.ctx, cost); err != nil {
					return err
				}
			}
			ms = ms[:k]
			if k == 0 {
				return nil // nothing to send: no "subscribed" before a cursor is known to be good
			}
		}
		return rs.deliver(ms)
	})
	if err == nil && r.delta != "" && last != "" {
		if o, cerr := d.CompareCursors(r.delta, last); cerr != nil {
			err = cerr
		} else if o > 0 {
			deltaErr = fmt.Errorf("%w: %s is ahead of the stream (its last event is %s)", broker.ErrBadCursor, r.delta, last)
		}
	}
	if err == nil {
		err = deltaErr
	}
	if errors.Is(err, broker.ErrSnapshotTooLarge) {
		if vs != nil && vs.Filter != nil {
			vs.Full = fanout.FullScan
		}
		if rs.reply() { // subscribed, then the error, as when the documents passed the bound here
			c.cl.Signal()
		}
		err = fanout.ErrViewTooLarge
	}
	switch {
	case err == nil:
	case rs.ctx.Err() != nil, errors.Is(err, ErrMailboxFull):
		return "", false
	default:
		c.failSubscribe(rs.id, err)
		return "", false
	}
	if rs.reply() {
		c.cl.Signal()
	}
	return last, true
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
func (c *conn) queueEvents(ctx context.Context, ms []broker.Message, st *subState, subs *fanout.SubsList, vs *fanout.View) error {
	wake := false
	defer func() {
		if wake {
			c.cl.Signal()
		}
	}()
	for _, m := range ms {
		if !subject.MatchEvent(st.pattern, m.Subject) {
			continue
		}
		ev, err := c.s.event(m)
		if err != nil {
			c.s.metrics.EventsInvalid.Inc()
			continue
		}
		if vs != nil {
			deliver, leave, tooLarge, cost := vs.Offer(ev.Subject, ev.ParsedNoKeep())
			if err := c.spendFilterCost(ctx, cost); err != nil {
				return err
			}
			switch {
			case tooLarge:
				return fanout.ErrViewTooLarge
			case leave:
				ev = fanout.NewLeave(ev)
			case !deliver:
				continue
			}
		}
		if c.cl.Mailbox.OverHalf() {
			if wake {
				c.cl.Signal()
				wake = false
			}
			if err := c.waitForClient(st, func() error { return c.cl.Mailbox.WaitRoom(ctx) }); err != nil {
				return err
			}
		}
		wasEmpty, err := c.push(fanout.Item{Ev: ev, Subs: subs})
		if err != nil {
			return err
		}
		wake = wake || wasEmpty
	}
	return ctx.Err()
}
