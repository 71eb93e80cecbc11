package broker

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
)

const (
	// DurablePrefix starts the server-side name of every durable consumer
	// a client names: a client can bind only fanwire's own durables, not
	// a consumer some other application keeps on the stream.
	DurablePrefix = "fanwire_"
	// ownerHashLen is the bytes of an owner's SHA-256 in its durables'
	// names (hex: twice as many characters): 96 bits, so no two owners of
	// one stream meet, in a name of at most 8+24+1+64 = 97 characters
	// (NATS takes 255).
	ownerHashLen = 12
	// consumerPull is a subscription consumer's pull window.
	consumerPull = 512
	// consumerMaxAckPending bounds the messages delivered to a
	// subscription but not yet acknowledged (queued for or in flight to its
	// client): past it the server waits.
	consumerMaxAckPending = 8192
	// consumerAckWait is how long the server waits for an ack before it
	// delivers a message again (the consumer drops such repeats).
	consumerAckWait = time.Minute
	// consumerHeartbeat is how often the server tells an idle subscription
	// consumer it is alive: a missed one makes the consumer look itself up.
	consumerHeartbeat = 5 * time.Second
	// Default inactivity thresholds.
	ephemeralInactive = time.Minute
	durableInactive   = 24 * time.Hour
)

// jsConsumer is a subscription's own JetStream pull consumer, with
// ack-all acknowledgement.
type jsConsumer struct {
	b     *JetStream
	cons  jetstream.Consumer
	name  string // server-side name
	start string
	bound bool

	// used by Consume and Ack, on the caller's goroutine
	last    uint64   // stream sequence of the last message delivered to h
	unacked []jsTail // the ack points h received, not yet acknowledged
}

type jsTail struct {
	seq uint64
	msg jetstream.Msg
}

// DurableName is the server-side name of owner's durable consumer name:
// DurablePrefix, a hash of owner (any owner string then fits the server's
// name rules, and says nothing of whose it is), '_' and name.
func DurableName(owner, name string) string { return durableOwnerPrefix(owner) + name }

func durableOwnerPrefix(owner string) string {
	sum := sha256.Sum256([]byte(owner))
	return DurablePrefix + hex.EncodeToString(sum[:ownerHashLen]) + "_"
}

// OpenConsumer opens a subscription's own consumer: it binds the durable
// consumer cfg.Name if it exists (same filter), or creates one (durable or
// ephemeral) that starts at cfg.From.
func (b *JetStream) OpenConsumer(ctx context.Context, cfg ConsumerConfig) (Consumer, error) {
	c := &jsConsumer{b: b}
	inactive := cfg.Inactive
	counted := false // a new durable, within its owner's cap before it was created
	if cfg.Name != "" {
		if !ValidConsumerName(cfg.Name) {
			return nil, fmt.Errorf("%w: name %q: use 1 to 64 letters, digits, '-' or '_'", ErrBadConsumer, cfg.Name)
		}
		c.name = DurableName(cfg.Owner, cfg.Name)
		bound, from, existed, err := c.bind(ctx, cfg)
		if bound || err != nil {
			return c, err
		}
		if from != "" { // re-created at its own position: still the same durable to the client
			cfg.From, c.bound = from, true
		}
		if !existed {
			if err := b.checkOwned(ctx, cfg, 0); err != nil {
				return nil, err
			}
			counted = true
		}
		if inactive == 0 {
			inactive = durableInactive
		}
	} else if inactive == 0 {
		inactive = ephemeralInactive
	}
	ccfg := jetstream.ConsumerConfig{
		Name:              c.name,
		Durable:           c.name,
		AckPolicy:         jetstream.AckAllPolicy,
		AckWait:           consumerAckWait,
		MaxAckPending:     consumerMaxAckPending,
		InactiveThreshold: inactive,
	}
	ccfg.FilterSubject, ccfg.FilterSubjects = b.consumerFilters(cfg.Filters)
	if c.name == "" {
		// An ephemeral consumer lives as long as its connection: its state
		// need not survive a server restart.
		ccfg.MemoryStorage, ccfg.Replicas = true, 1
	}
	switch cfg.From {
	case "first":
		ccfg.DeliverPolicy = jetstream.DeliverAllPolicy
	case "":
		// Live: from the next sequence, stated exactly (not "deliver new"),
		// so that Start is exact.
		st, err := b.checkAfter(ctx, 0)
		if err != nil {
			return nil, err
		}
		ccfg.DeliverPolicy, ccfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, st.LastSeq+1
		if st.LastSeq > 0 {
			c.start = FormatJSCursor(st.LastSeq)
		}
	default:
		a, err := ParseJSCursor(cfg.From)
		if err != nil {
			return nil, err
		}
		if _, err := b.checkAfter(ctx, a); err != nil {
			return nil, err
		}
		ccfg.DeliverPolicy, ccfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, a+1
		c.start = cfg.From
	}
	cons, err := b.js.CreateConsumer(ctx, b.cfg.Stream, ccfg)
	if errors.Is(err, jetstream.ErrConsumerExists) && c.name != "" {
		// Created meanwhile by another subscription: bind that one.
		if bound, _, _, err := c.bind(ctx, cfg); bound || err != nil {
			return c, err
		}
	}
	if err != nil {
		return nil, fmt.Errorf("jetstream: create consumer for %s: %w", strings.Join(cfg.Filters, ","), unsupported(err))
	}
	c.cons, c.name = cons, cons.CachedInfo().Name
	if counted {
		// Counted again with it: two nodes creating the owner's last
		// durable at once both passed the first count, and the one
		// that finds itself over the cap gives its slot back.
		if err := b.checkOwned(ctx, cfg, 1); err != nil {
			if derr := c.Delete(ctx); derr != nil {
				b.core.log.Warn("deleting a durable over its owner's cap (the server removes it when inactive)", zap.String("consumer", c.name), zap.Error(derr))
			}
			return nil, err
		}
	}
	return c, nil
}

// checkOwned counts cfg.Owner's durable consumers on the stream, mine of
// them being the caller's own new one, and fails with ErrTooManyConsumers
// when one more than the others would pass cfg.MaxDurables (0: no cap).
// The server lists names a page at a time: this costs a round trip per
// 1,024 consumers on the stream, once per new durable.
func (b *JetStream) checkOwned(ctx context.Context, cfg ConsumerConfig, mine int) error {
	if cfg.MaxDurables <= 0 {
		return nil
	}
	prefix := durableOwnerPrefix(cfg.Owner)
	l := b.stream.ConsumerNames(ctx)
	n := 0
	for name := range l.Name() { // drained: the lister's goroutine ends when it closes the channel
		if strings.HasPrefix(name, prefix) {
			n++
		}
	}
	if err := l.Err(); err != nil {
		return fmt.Errorf("jetstream: count durable consumers: %w", err)
	}
	if others := n - mine; others >= cfg.MaxDurables {
		return fmt.Errorf("%w: %d kept by this owner, the most allowed is %d", ErrTooManyConsumers, others, cfg.MaxDurables)
	}
	return nil
}

// bind looks the durable consumer up and binds it if it exists. A durable
// with messages delivered but not acknowledged (its last connection went
// away with them queued) would hold them back for AckWait: it is deleted
// instead, and bind returns where to create it again (from).
// existed says that there was one (bound, or deleted to be created again):
// opening it adds no durable to its owner's.
func (c *jsConsumer) bind(ctx context.Context, cfg ConsumerConfig) (bound bool, from string, existed bool, err error) {
	cons, err := c.b.js.Consumer(ctx, c.b.cfg.Stream, c.name)
	if errors.Is(err, jetstream.ErrConsumerNotFound) {
		return false, "", false, nil
	}
	if err != nil {
		return false, "", false, fmt.Errorf("jetstream: look up durable %q: %w", cfg.Name, err)
	}
	info := cons.CachedInfo()
	have := info.Config.FilterSubjects
	if info.Config.FilterSubject != "" {
		have = []string{info.Config.FilterSubject}
	}
	// As it was made (see consumerFilters): several filters on a server
	// older than 2.10 made one on the whole stream.
	one, several := c.b.consumerFilters(cfg.Filters)
	want := several
	if one != "" {
		want = []string{one}
	}
	if !slices.Equal(sortedCopy(have), sortedCopy(want)) {
		return false, "", true, fmt.Errorf("%w: durable %q follows %s, not %s (unsubscribing from it deletes it)", ErrBadConsumer, cfg.Name, strings.Join(have, ","), strings.Join(cfg.Filters, ","))
	}
	if info.Config.AckPolicy != jetstream.AckAllPolicy {
		return false, "", true, fmt.Errorf("%w: consumer %q was not made by fanwire (ack policy %s)", ErrBadConsumer, c.name, info.Config.AckPolicy)
	}
	// It delivers after its ack floor; before any ack, from where it was
	// told to start.
	after := info.AckFloor.Stream
	if after == 0 && info.Config.DeliverPolicy == jetstream.DeliverByStartSequencePolicy && info.Config.OptStartSeq > 0 {
		after = info.Config.OptStartSeq - 1
	}
	if cfg.From != "" {
		// Told where to start: the client holds a cursor, which is exact.
		if err := c.b.js.DeleteConsumer(ctx, c.b.cfg.Stream, c.name); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
			return false, "", true, fmt.Errorf("jetstream: reposition consumer %q: %w", c.name, err)
		}
		return false, "", true, nil
	}
	if info.NumAckPending > 0 {
		if err := c.b.js.DeleteConsumer(ctx, c.b.cfg.Stream, c.name); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
			return false, "", true, fmt.Errorf("jetstream: reset consumer %q: %w", c.name, err)
		}
		if after == 0 {
			return false, "first", true, nil
		}
		return false, FormatJSCursor(after), true, nil
	}
	if after > 0 {
		c.start = FormatJSCursor(after)
	}
	c.cons, c.bound = cons, true
	return true, "", true, nil
}

func (c *jsConsumer) Start() string { return c.start }
func (c *jsConsumer) Bound() bool   { return c.bound }

// Consume pulls the consumer, batching to h. When h is slow the callback
// blocks and the library stops pulling: the server holds the backlog.
func (c *jsConsumer) Consume(ctx context.Context, tick time.Duration, h func([]Message)) error {
	ch := make(chan jetstream.Msg, consumerPull)
	check := make(chan struct{}, 1)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	cc, err := c.cons.Consume(func(m jetstream.Msg) {
		select {
		case ch <- m:
		case <-ctx.Done():
		}
	}, jetstream.PullMaxMessages(consumerPull), jetstream.PullHeartbeat(consumerHeartbeat),
		jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
			c.b.core.log.Debug("jetstream subscription consumer", zap.String("consumer", c.name), zap.Error(err))
			select { // look whether the consumer still exists (below)
			case check <- struct{}{}:
			default:
			}
		}))
	if err != nil {
		return fmt.Errorf("jetstream: consume %q: %w", c.name, err)
	}
	defer func() {
		cancel()
		cc.Stop()
		<-cc.Closed()
	}()
	t := time.NewTicker(tick)
	defer t.Stop()
	batch := make([]Message, 0, maxBatch)
	checking := false // an error was reported: look up the consumer until it answers
	for {
		var m jetstream.Msg
		select {
		case m = <-ch:
		case <-check:
			checking = true
			continue
		case <-t.C:
			if checking {
				// The library pulls again after a reconnect, but a consumer
				// the server lost (a restart loses an in-memory one) stays
				// silent forever: the caller must open a new one.
				ictx, icancel := context.WithTimeout(ctx, tick)
				_, err := c.cons.Info(ictx)
				icancel()
				switch {
				case errors.Is(err, jetstream.ErrConsumerNotFound), errors.Is(err, jetstream.ErrStreamNotFound):
					return fmt.Errorf("jetstream: consumer %q is gone from the server: %w", c.name, err)
				case err == nil:
					checking = false
				}
			}
			h(nil)
			continue
		case <-c.b.core.closed:
			return ErrClosed
		case <-cc.Closed():
			return fmt.Errorf("jetstream: consumer %q stopped (deleted on the server?)", c.name)
		case <-ctx.Done():
			return ctx.Err()
		}
		var tail jsTail // the batch's last message, unless it is an ack point already
	fill:
		for {
			meta, err := m.Metadata()
			if err != nil {
				return fmt.Errorf("jetstream: consumer %q: %w", c.name, err)
			}
			// A message not acknowledged within AckWait comes again; h
			// has had it.
			if seq := meta.Sequence.Stream; seq > c.last {
				c.last = seq
				batch = append(batch, Message{Subject: m.Subject(), Data: m.Data(), Cursor: FormatJSCursor(seq)})
				tail = jsTail{seq: seq, msg: m}
				if len(batch)%AckEvery == 0 { // an ack point (see Consumer.Ack)
					c.unacked = append(c.unacked, tail)
					tail = jsTail{}
				}
			}
			if len(batch) == cap(batch) {
				break
			}
			select {
			case m = <-ch:
			default:
				break fill
			}
		}
		if tail.msg != nil {
			c.unacked = append(c.unacked, tail)
		}
		if len(batch) == 0 {
			continue
		}
		h(batch)
		clear(batch)
		batch = batch[:0]
	}
}

// Ack acknowledges (ack-all) the last ack point at or before cursor.
func (c *jsConsumer) Ack(ctx context.Context, cursor string, wait bool) error {
	seq, err := ParseJSCursor(cursor)
	if err != nil {
		return err
	}
	i := 0
	for i < len(c.unacked) && c.unacked[i].seq <= seq {
		i++
	}
	if i == 0 {
		return nil
	}
	m := c.unacked[i-1].msg
	n := copy(c.unacked, c.unacked[i:])
	clear(c.unacked[n:])
	c.unacked = c.unacked[:n]
	if wait {
		err = m.DoubleAck(ctx)
	} else {
		err = m.Ack()
	}
	if err != nil {
		return fmt.Errorf("jetstream: ack on %q: %w", c.name, err)
	}
	return nil
}

// Delete removes the consumer from the server.
func (c *jsConsumer) Delete(ctx context.Context) error {
	if err := c.b.js.DeleteConsumer(ctx, c.b.cfg.Stream, c.name); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
		return fmt.Errorf("jetstream: delete consumer %q: %w", c.name, err)
	}
	return nil
}
