package gateway

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/fanwire/fanwire/gateway/internal/fanout"
	"github.com/fanwire/fanwire/gateway/internal/filter"

	"github.com/fanwire/fanwire/broker"
	"go.uber.org/zap"
)

// Consumer modes (Config.Consumer).
const (
	// ConsumerShared: one live consumer per node feeds the hub; every
	// subscription is an entry in its index (resumes replay, then join).
	ConsumerShared = "shared"
	// ConsumerPerConnection: every subscription gets its own consumer on
	// the broker (JetStream), which tracks its position.
	ConsumerPerConnection = "per-connection"
)

// feedState is a subscription served by its own broker consumer instead of
// the hub: a "durable" subscription, or any subscription with
// --consumer per-connection.
type feedState struct {
	durable string // the client's durable name; "" for an ephemeral consumer
	key     string // the durable's name on the broker, claimed on this node (claimDurable); "" for an ephemeral consumer

	view *fanout.View // a filtered feed's view (outside the view index); nil: unfiltered

	// Set by the feed goroutine; read by whoever waited for done.
	cons    broker.Consumer
	pending []feedAck
}

// feedAck is a batch end queued for the client but perhaps not yet written:
// it is acknowledged once the writer has written pushed items.
type feedAck struct {
	pushed uint64 // the mailbox's push count after the batch
	cursor string
}

const (
	// feedAckTick is how often an idle feed acknowledges what has been
	// written.
	feedAckTick = 50 * time.Millisecond
	// feedEndTimeout bounds the broker calls that end a connection's or an
	// unsubscribed subscription's feeds (last acks, deletes); the server
	// removes what they miss when it is inactive.
	feedEndTimeout = 5 * time.Second
	// feedOpenTimeout bounds opening a subscription's consumer: past it
	// (the broker is down or electing) the client gets broker_unavailable
	// and may retry, instead of waiting without a reply.
	feedOpenTimeout = 10 * time.Second
)

// startFeed opens the subscription's own consumer and serves it on a task
// goroutine.
func (c *conn) startFeed(id, pattern string, from *string, durable *string, flt *filter.Filter) {
	cs := c.s.consumers
	if cs == nil {
		c.clientError(id, CodeBadDurable, "this gateway's broker keeps no consumers: durable subscriptions need --broker jetstream")
		return
	}
	f := &feedState{}
	cfg := broker.ConsumerConfig{Filters: c.s.replayFilters(pattern), Inactive: c.s.cfg.DurableInactive, MaxDurables: max(c.s.cfg.MaxDurables, 0)}
	if durable != nil {
		if !broker.ValidConsumerName(*durable) {
			c.clientError(id, CodeBadDurable, "durable name "+strconv.Quote(*durable)+": use 1 to 64 letters, digits, '-' or '_'")
			return
		}
		owner, err := c.durableOwner()
		if err != nil {
			c.clientError(id, CodeBadDurable, "durable "+strconv.Quote(*durable)+": "+err.Error())
			return
		}
		key := broker.DurableName(owner, *durable)
		if !c.s.claimDurable(key) {
			c.clientError(id, CodeDurableInUse, "durable "+strconv.Quote(*durable)+" is in use by another subscription on this gateway (a previous connection's until it closes or its ping times out): try again later")
			return
		}
		f.durable, f.key = *durable, key
		cfg.Name, cfg.Owner = *durable, owner
	}
	if from != nil {
		cfg.From = *from
	}
	if flt != nil {
		// Filtered: the events its filter accepts, and leaves for the
		// documents this connection was sent (a durable bound again
		// starts holding none: see docs/protocol.md, "Live views").
		f.view = c.newViewSub(id, pattern, flt)
	}
	st := &subState{pattern: pattern, feed: f}
	ctx, ok := c.startTask(id, st)
	if !ok {
		c.s.releaseDurable(f.key)
		return
	}
	go c.feed(ctx, id, st, cfg)
}

// feed serves one subscription from its consumer: "subscribed" with the
// cursor it starts after, then every event, with flow control (a slow
// client makes the consumer stop pulling; the broker holds the backlog, so
// there is no slow-consumer close). A batch is acknowledged once the
// writer has written it, so a durable bound again after a disconnect
// starts with what the client was not sent.
func (c *conn) feed(ctx context.Context, id string, st *subState, cfg broker.ConsumerConfig) {
	defer c.tasks.Done()
	defer close(st.task.done)
	defer st.task.cancel()
	f := st.feed
	octx, cancel := context.WithTimeout(ctx, feedOpenTimeout)
	cons, err := c.s.consumers.OpenConsumer(octx, cfg)
	cancel()
	if err != nil {
		c.s.releaseDurable(f.key)
		if ctx.Err() == nil {
			c.failSubscribe(id, c.durableError(f, err))
		}
		return
	}
	f.cons = cons
	c.send(c.subscribedMsg(id, cons.Start()))
	c.subsMu.Lock()
	st.live = true
	c.subsMu.Unlock()
	c.s.metrics.Subscriptions.Inc()
	subs := c.cl.SubsFor([]string{id})
	last := cons.Start()
	cctx, stop := context.WithCancel(ctx)
	defer stop()
	var viewErr error
	for {
		err := cons.Consume(cctx, feedAckTick, func(ms []broker.Message) {
			c.ackWritten(cctx, f, false)
			if len(ms) == 0 {
				return
			}
			// Queued in chunks that end at the consumer's ack points, each
			// acknowledged once written.
			for i := 0; i < len(ms); i += broker.AckEvery {
				chunk := ms[i:min(i+broker.AckEvery, len(ms))]
				if err := c.queueEvents(cctx, chunk, st, subs, f.view); err != nil {
					if errors.Is(err, fanout.ErrViewTooLarge) {
						viewErr = err
					}
					stop() // the connection is ending, or the view outgrew its bound
					return
				}
				last = chunk[len(chunk)-1].Cursor
				f.pending = append(f.pending, feedAck{pushed: c.cl.Mailbox.Pushes(), cursor: last})
			}
		})
		if viewErr != nil && ctx.Err() == nil {
			c.subsMu.Lock()
			st.live = false
			c.subsMu.Unlock()
			c.s.metrics.Subscriptions.Dec()
			ectx, cancel := context.WithTimeout(context.Background(), feedEndTimeout)
			c.endFeed(ectx, f, false)
			cancel()
			c.failSubscribe(id, viewErr)
			return
		}
		if cctx.Err() != nil || errors.Is(err, broker.ErrClosed) { // the node is stopping
			return
		}
		// The consumer is gone (deleted on the server, the server lost its
		// state): open it again right after the last event queued, waiting
		// out a broker that is down or electing, as the live feed does.
		c.s.log.Warn("subscription consumer stopped; reopening", zap.String("conn", c.id), zap.String("sub", id), zap.Error(err))
		if last != "" {
			cfg.From = last
		}
		var next broker.Consumer
		for wait := time.Second; next == nil; wait = min(2*wait, 10*time.Second) {
			select {
			case <-cctx.Done():
				return
			case <-time.After(wait):
			}
			octx, cancel := context.WithTimeout(cctx, feedOpenTimeout)
			next, err = c.s.consumers.OpenConsumer(octx, cfg)
			cancel()
			if err == nil || cctx.Err() != nil {
				continue
			}
			if subscribeErrorCode(err) == CodeBrokerUnavailable && !errors.Is(err, broker.ErrUnsupported) {
				c.s.log.Warn("reopening a subscription consumer failed; retrying", zap.String("conn", c.id), zap.String("sub", id), zap.Error(err))
				continue
			}
			// Its position is gone (retention passed it): the client must
			// re-sync, as with a resume from an expired cursor.
			c.failSubscribe(id, c.durableError(f, err))
			c.subsMu.Lock()
			st.live = false
			c.subsMu.Unlock()
			c.s.metrics.Subscriptions.Dec()
			f.cons = nil
			c.s.releaseDurable(f.key)
			return
		}
		f.cons, f.pending, cons = next, nil, next
	}
}

// ackWritten acknowledges the last batch the writer has written.
func (c *conn) ackWritten(ctx context.Context, f *feedState, wait bool) {
	w := c.written.Load()
	k := 0
	for k < len(f.pending) && f.pending[k].pushed <= w {
		k++
	}
	if k == 0 {
		return
	}
	if err := f.cons.Ack(ctx, f.pending[k-1].cursor, wait); err != nil {
		c.s.log.Debug("subscription ack", zap.String("conn", c.id), zap.Error(err))
	}
	n := copy(f.pending, f.pending[k:])
	f.pending = f.pending[:n]
}

// endFeed finishes a subscription whose feed goroutine has exited: it
// acknowledges what was written and deletes the consumer when it is
// ephemeral or the client unsubscribed. Call it once writes are over
// (connection end) or when the consumer is being deleted anyway. ctx
// bounds the broker calls (feedEndTimeout).
func (c *conn) endFeed(ctx context.Context, f *feedState, unsubscribed bool) {
	if f.cons == nil { // failed: the feed released its name
		return
	}
	defer c.s.releaseDurable(f.key)
	if f.durable == "" || unsubscribed {
		if err := f.cons.Delete(ctx); err != nil {
			c.s.log.Warn("deleting a subscription consumer (the server removes it when inactive)", zap.String("conn", c.id), zap.Error(err))
		}
		return
	}
	c.ackWritten(ctx, f, true)
}

// failSubscribe reports why a subscription could not start (or went on)
// and forgets it; the connection stays.
func (c *conn) failSubscribe(id string, err error) {
	c.subsMu.Lock()
	st := c.subs[id]
	delete(c.subs, id)
	c.subsMu.Unlock()
	code, msg := subscribeErrorCode(err), err.Error()
	if code == CodeViewTooLarge {
		full := fanout.FullView
		if st != nil && st.view != nil {
			full = st.view.Full
		} else if st != nil && st.feed != nil && st.feed.view != nil {
			full = st.feed.view.Full
		}
		msg = c.s.viewTooLargeText(id, full)
	}
	c.s.metrics.ClientErrors.WithLabelValues(code).Inc()
	c.send(c.errorMsg(id, code, msg))
}

// subscribeErrorCode is the client's error code for a broker's refusal to
// replay or open a consumer. Only broker_unavailable is transient: the
// others say the client's cursor or durable cannot work, and retrying the
// same request cannot help.
func subscribeErrorCode(err error) string {
	switch {
	case errors.Is(err, fanout.ErrViewTooLarge):
		return CodeViewTooLarge
	case errors.Is(err, errSyncedTooLarge):
		return CodeTooLarge
	case errors.Is(err, broker.ErrCursorExpired):
		return CodeCursorExpired
	case errors.Is(err, broker.ErrBadCursor):
		return CodeBadCursor
	case errors.Is(err, broker.ErrBadConsumer):
		return CodeBadDurable
	case errors.Is(err, broker.ErrTooManyConsumers):
		return CodeTooManyDurables
	}
	return CodeBrokerUnavailable
}

// durableOwner is the principal whose durables the connection binds (the
// broker's ConsumerConfig.Owner): a token's sub, or one namespace shared
// by every connection without a token (and every connection of a gateway
// that authenticates none) when AnonymousDurables allows it.
func (c *conn) durableOwner() (string, error) {
	switch g := c.grants; {
	case g == nil || g.Anonymous:
		if !c.s.cfg.AnonymousDurables {
			return "", errors.New("connections without a token keep no durables on this gateway (--anonymous-durables)")
		}
		return "anonymous", nil
	case g.Subject == "":
		return "", errors.New(`durables belong to a token's "sub", and this connection's token has none`)
	default:
		return "sub:" + g.Subject, nil
	}
}

// durableError is the client's error for a broker's refusal to open f's
// consumer: past the cap, it names the flag.
func (c *conn) durableError(f *feedState, err error) error {
	if errors.Is(err, broker.ErrTooManyConsumers) {
		return fmt.Errorf("durable %q refused by --max-durables (per token sub): %w; unsubscribing from a durable deletes it", f.durable, err)
	}
	return err
}

// claimDurable marks a durable (its name on the broker, its owner's) in
// use on this node; a second subscription pulling the same consumer would
// split its events.
func (s *Server) claimDurable(name string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.durables[name] {
		return false
	}
	s.durables[name] = true
	return true
}

func (s *Server) releaseDurable(name string) {
	if name == "" {
		return
	}
	s.mu.Lock()
	delete(s.durables, name)
	s.mu.Unlock()
}

// event builds the event of a message a replay or a feed delivered to one
// subscription.
func (s *Server) event(m broker.Message) (*fanout.Event, error) {
	if s.replayEvents == nil {
		return s.newEvent(m)
	}
	return s.replayEvents.event(m, s.ingestTruncate)
}

// newEvent builds the event of a broker message, marking the ingest's
// truncates.
func (s *Server) newEvent(m broker.Message) (*fanout.Event, error) {
	ev, err := fanout.NewEvent(m.Subject, m.Cursor, m.Data)
	if err == nil {
		ev.IngestTruncate = s.ingestTruncate(m.Subject)
	}
	return ev, err
}

// ingestTruncate reports whether subject is a truncate's on the ingest's
// reserved subjects.
func (s *Server) ingestTruncate(subject string) bool {
	return strings.HasSuffix(subject, "."+filter.TruncateToken) && s.ingestSubject(subject)
}

// eventCache shares the events replays and feeds build: each
// subscription's replay or consumer delivers its own copy of a message, but
// the subscriptions of a node read mostly the same ones at about the same
// time, so each event is validated and framed about once per node instead
// of once per subscription. It is a direct-mapped table keyed by cursor; a
// miss builds the event.
type eventCache struct {
	slots [eventCacheSize]atomic.Pointer[fanout.Event]
}

const eventCacheSize = 4096

func (ec *eventCache) event(m broker.Message, ingestTruncate func(string) bool) (*fanout.Event, error) {
	slot := &ec.slots[maphash.String(eventCacheSeed, m.Cursor)%eventCacheSize]
	if ev := slot.Load(); ev != nil && ev.Cursor == m.Cursor && ev.Subject == m.Subject {
		return ev, nil
	}
	ev, err := fanout.NewEvent(m.Subject, m.Cursor, m.Data)
	if err != nil {
		return nil, err
	}
	ev.IngestTruncate = ingestTruncate(m.Subject)
	slot.Store(ev)
	return ev, nil
}

var eventCacheSeed = maphash.MakeSeed()
