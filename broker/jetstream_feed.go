package broker

// The live feed: one ordered consumer per JetStream broker that delivers
// every message stored after it starts, and the watch that re-creates a
// stream the server lost (a memory stream across a restart).

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
)

// Consume delivers every message stored after it starts, with its cursor,
// through one ordered consumer (the library recreates it after a gap or a
// reconnect). When h falls behind, the consumer stops pulling: the backlog
// stays in the stream, nothing is dropped.
//
// It starts right after the stream's last sequence at the time it starts
// (by sequence, not "deliver new", so the start is exact) and reports that
// position to started: a resuming subscription replays up to it.
func (b *JetStream) Consume(ctx context.Context, h Handler, started func(start string)) error {
	info, err := b.stream.Info(ctx)
	if err != nil {
		return fmt.Errorf("jetstream: stream info: %w", err)
	}
	last := info.State.LastSeq
	// The stream's subjects are the subject space: filtering on them is
	// for a stream an operator widened, and needs NATS 2.10 when there are
	// several (the library sends one as the single filter 2.9 takes).
	var filters []string
	if len(b.cfg.Subjects) == 1 || b.since210 {
		filters = b.cfg.Subjects
	}
	cons, err := b.js.OrderedConsumer(ctx, b.cfg.Stream, jetstream.OrderedConsumerConfig{
		FilterSubjects: filters,
		DeliverPolicy:  jetstream.DeliverByStartSequencePolicy,
		OptStartSeq:    last + 1,
	})
	if err != nil {
		return fmt.Errorf("jetstream: ordered consumer on %q: %w", b.cfg.Stream, unsupported(err))
	}
	start := ""
	if last > 0 {
		start = FormatJSCursor(last)
	}
	return b.run(ctx, cons, last, h, func() {
		if started != nil {
			started(start)
		}
	})
}

// consumeHeartbeat is how often the server tells the live feed's consumer
// that it is alive while no message comes. Two missed in a row and the
// library re-creates the consumer: on a cluster, the node holding it may
// have failed while this connection, on another node, stayed up. The
// library's 5 s default stalled the feed of a gateway on a surviving node
// for 10 s when the stream leader's node stopped.
const consumeHeartbeat = time.Second

// run consumes cons, which starts after stream sequence after, batching
// messages to h, until ctx is done or the broker is closed. Meanwhile watchStream re-creates the
// stream if it is lost.
func (b *JetStream) run(ctx context.Context, cons jetstream.Consumer, after uint64, h Handler, started func()) error {
	ch := make(chan Message, cmp.Or(b.buffer, consumeBuffer))
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var last atomic.Uint64 // stream sequence of the last message handed to the handler below
	last.Store(after)
	check := make(chan struct{}, 1) // asks watchStream to look for the stream
	cc, err := cons.Consume(func(m jetstream.Msg) {
		meta, err := m.Metadata()
		if err != nil {
			b.core.log.Warn("jetstream message without metadata", zap.Error(err))
			return
		}
		// The feed filters on the stream's own subjects: a sequence it skips
		// was removed (retention, a purge) before this node read it.
		if prev := last.Swap(meta.Sequence.Stream); meta.Sequence.Stream > prev+1 && b.cfg.OnGap != nil {
			b.cfg.OnGap(int(meta.Sequence.Stream - prev - 1))
		}
		// What the feed sees is stored: it bounds Publish's search (findTagged).
		b.observe(meta.Sequence.Stream)
		select { // blocking: a slow dispatcher makes the consumer stop pulling
		case ch <- Message{Subject: m.Subject(), Data: m.Data(), Cursor: FormatJSCursor(meta.Sequence.Stream)}:
		case <-ctx.Done():
		}
	}, jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
		b.core.log.Debug("jetstream consume", zap.Error(err))
		select {
		case check <- struct{}{}:
		default:
		}
	}), jetstream.PullHeartbeat(consumeHeartbeat))
	if err != nil {
		return fmt.Errorf("jetstream: consume %q: %w", b.cfg.Stream, err)
	}
	reconnected := b.core.nc.StatusChanged(nats.CONNECTED)
	var watch sync.WaitGroup
	watch.Go(func() { b.watchStream(ctx, check, reconnected, &last) })
	defer func() {
		cancel() // unblocks a handler waiting to send, and ends watchStream
		cc.Stop()
		<-cc.Closed()
		watch.Wait()
		b.core.nc.RemoveStatusListener(reconnected)
	}()
	if started != nil {
		started()
	}
	batch := make([]Message, 0, maxBatch)
	for {
		var m Message
		select {
		case m = <-ch:
		case <-ctx.Done():
			return ctx.Err()
		case <-b.core.closed:
			return ErrClosed
		}
		arrived := time.Now()
		batch = append(batch[:0], m)
	fill:
		for len(batch) < maxBatch {
			select {
			case m = <-ch:
				batch = append(batch, m)
			default:
				break fill
			}
		}
		h(batch, arrived)
		clear(batch)
	}
}

// watchStream re-creates the stream if it is gone, each time it is asked
// to look: after a reconnect (a restarted server has lost a memory stream)
// or when the consumer reports trouble (deleting a stream deletes its
// consumers). The live feed's ordered consumer, which the library keeps
// trying to re-create (at most 10 s apart), then finds it. last is the
// stream sequence of the last message delivered.
func (b *JetStream) watchStream(ctx context.Context, check <-chan struct{}, reconnected <-chan nats.Status, last *atomic.Uint64) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-check:
		case <-reconnected:
		}
		for wait := streamLookMin; !b.restoreStream(ctx, last.Load()); wait = min(2*wait, streamLookMax) {
			select {
			case <-ctx.Done():
				return
			case <-time.After(wait):
			}
		}
	}
}

// restoreStream looks for the stream and re-creates it if the server says
// it does not exist. It reports false when it got no answer (a reconnect
// in progress, an election): look again later.
func (b *JetStream) restoreStream(ctx context.Context, last uint64) bool {
	ctx, cancel := context.WithTimeout(ctx, streamLookTimeout)
	defer cancel()
	_, err := b.js.Stream(ctx, b.cfg.Stream)
	if err == nil {
		return true
	}
	if !errors.Is(err, jetstream.ErrStreamNotFound) {
		b.core.log.Debug("jetstream: looking for the stream", zap.Error(err))
		return false
	}
	if !b.since210 {
		// Older than 2.10, the server ignores first_seq: the stream would
		// be numbered from 1 again, and the live feeds would skip its
		// events until they pass the old numbers. (DialJetStream refuses
		// memory storage there; a file stream is lost only if deleted.)
		b.core.log.Error("JetStream stream is gone and this nats-server cannot re-create it numbered on after its last event (first_seq needs 2.10): restart the fanwire nodes, which create it at start, or upgrade the server",
			zap.String("stream", b.cfg.Stream), zap.String("version", b.version))
		return true
	}
	// Numbered on after the last event delivered, cursors keep increasing
	// (the hub's hand-over compares them) and those of the lost history
	// are older than the new stream: expired, so a client re-syncs.
	want := b.want
	want.FirstSeq = last + 1
	if _, err := b.js.CreateStream(ctx, want); err != nil {
		if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			return true // another node (or a publisher) re-created it first
		}
		b.core.log.Warn("jetstream: re-creating the lost stream", zap.String("stream", want.Name), zap.Error(err))
		return false
	}
	b.core.log.Warn("JetStream stream was gone (a memory stream does not survive a server restart): re-created it with the configured settings; its history is lost and older cursors have expired",
		zap.String("stream", want.Name), zap.String("storage", want.Storage.String()), zap.String("first_cursor", FormatJSCursor(want.FirstSeq)))
	return true
}

const (
	// streamLookMin and streamLookMax space watchStream's attempts while
	// the server does not answer.
	streamLookMin = 100 * time.Millisecond
	streamLookMax = 5 * time.Second
	// streamLookTimeout bounds one look (and re-creation). A request the
	// failing server took down with it is never answered, and the look
	// that a consume error starts often goes to a server shutting down:
	// the answer takes milliseconds, so give up soon and look again.
	streamLookTimeout = time.Second
)
