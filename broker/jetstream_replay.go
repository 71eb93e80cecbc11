package broker

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
)

// deleteShortLived deletes a replay's or a snapshot's consumer (what
// names it in the log), best effort and detached from ctx: a cancelled
// read still cleans up, and the inactivity threshold covers a failure.
func (b *JetStream) deleteShortLived(ctx context.Context, name, what string) {
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := b.js.DeleteConsumer(dctx, b.cfg.Stream, name); err != nil {
		b.core.log.Debug("jetstream: delete "+what+" consumer", zap.Error(err))
	}
}

// Replay reads the stream from the sequence after `after` up to `until`
// (the watermark) through a short-lived consumer. On a server older than
// 2.10, a replay on several filters reads every subject (see
// consumerFilters): callers match each message, as Durable says.
//
// The consumer is a plain ephemeral pull consumer (no acks, state in
// memory), consumed with a pull window that the library refills ahead of
// us. An ordered consumer's Fetch would be simpler, but it deletes and
// re-creates its server-side consumer on every call: 10,000 events of
// catch-up cost ten consumer creations and ran at 90k events/s.
func (b *JetStream) Replay(ctx context.Context, filters []string, after, until string, h func([]Message) error) error {
	var a uint64
	if after != "" {
		var err error
		if a, err = ParseJSCursor(after); err != nil {
			return err
		}
	}
	u, err := ParseJSCursor(until)
	if err != nil {
		return err
	}
	if _, err := b.checkAfter(ctx, a); err != nil {
		return err
	}
	if u <= a {
		return nil
	}
	ccfg := jetstream.ConsumerConfig{
		DeliverPolicy: jetstream.DeliverAllPolicy,
		AckPolicy:     jetstream.AckNonePolicy,
		// Removed by the server if this process dies before deleting it.
		InactiveThreshold: replayInactive,
		MemoryStorage:     true,
		Replicas:          1,
	}
	ccfg.FilterSubject, ccfg.FilterSubjects = b.consumerFilters(filters)
	if a > 0 {
		ccfg.DeliverPolicy, ccfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, a+1
	}
	cons, err := b.js.CreateConsumer(ctx, b.cfg.Stream, ccfg)
	if err != nil {
		return fmt.Errorf("jetstream: replay consumer: %w", unsupported(err))
	}
	defer b.deleteShortLived(ctx, cons.CachedInfo().Name, "replay")
	if cons.CachedInfo().NumPending == 0 {
		return nil // nothing stored on filters after `after`
	}
	// Every message up to until is stored and there is at least one on
	// filters after `after`: Next never waits for an event that is not
	// there. It stops at until, or when nothing more is pending.
	it, err := cons.Messages(jetstream.PullMaxMessages(replayBatch))
	if err != nil {
		return fmt.Errorf("jetstream: replay: %w", err)
	}
	defer func() { it.Stop() }() // the last iterator (see pullLost)
	batch := make([]Message, 0, maxBatch)
	got := a        // the stream sequence of the last message received
	var dseq uint64 // its consumer sequence: without acks, each message is delivered once, numbered on from 1
	for {
		m, err := it.Next(jetstream.NextMaxWait(replayStall))
		if errors.Is(err, nats.ErrTimeout) && ctx.Err() == nil {
			// Slow (a loaded machine, a failover), or the messages still
			// to come were removed meanwhile (retention): ask the server.
			info, ierr := cons.Info(ctx)
			if ierr != nil {
				return fmt.Errorf("jetstream: replay: %w", ierr)
			}
			if pullLost(info, dseq) {
				it.Stop()
				if it, err = cons.Messages(jetstream.PullMaxMessages(replayBatch)); err != nil {
					return fmt.Errorf("jetstream: replay: %w", err)
				}
				continue
			}
			if info.NumPending == 0 && info.NumAckPending == 0 && info.Delivered.Stream > got && got < u {
				// The server sent messages that never arrived (without
				// acks it counts them delivered): seen in a storm of
				// 2,000 resumes at once, where ending here as done left
				// each of those clients a gap. Fail: the caller replays
				// again after the last message it was handed.
				if len(batch) > 0 {
					if err := h(batch); err != nil {
						return err
					}
				}
				return fmt.Errorf("jetstream: replay: the server delivered through %s, %s arrived", FormatJSCursor(info.Delivered.Stream), FormatJSCursor(got))
			}
			if info.NumPending == 0 && info.NumAckPending == 0 {
				if len(batch) > 0 {
					if err := h(batch); err != nil {
						return err
					}
				}
				return ctx.Err()
			}
			continue
		}
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("jetstream: replay: %w", err)
		}
		meta, err := m.Metadata()
		if err != nil {
			return fmt.Errorf("jetstream: replay: %w", err)
		}
		if meta.Sequence.Consumer != dseq+1 {
			// A gap: delivered to an iterator stopped as lost (its pull
			// request came after all), or lost on the way. Fail as above.
			if len(batch) > 0 {
				if err := h(batch); err != nil {
					return err
				}
			}
			return fmt.Errorf("jetstream: replay: the server delivered messages after %s that never arrived", FormatJSCursor(got))
		}
		dseq = meta.Sequence.Consumer
		seq := meta.Sequence.Stream
		got = seq
		if seq <= u {
			batch = append(batch, Message{Subject: m.Subject(), Data: m.Data(), Cursor: FormatJSCursor(seq)})
		}
		done := seq >= u || meta.NumPending == 0
		if len(batch) == cap(batch) || (done && len(batch) > 0) {
			if err := h(batch); err != nil {
				return err
			}
			clear(batch)
			batch = batch[:0]
		}
		if done {
			return ctx.Err()
		}
	}
}

// pullLost reports whether a short-lived consumer that a read has waited
// replayStall for holds no pull request while it has messages to deliver,
// and has delivered none that the read did not receive (dseq, the consumer
// sequence of the last one received): its pull request never reached it.
// nats.go would wait for it forever (its check for missed heartbeats
// restarts with every Next), so the read stops the iterator and opens
// another, which pulls again. On a 3-node cluster about 1 in 100 new R1
// consumers placed on another node than the client's never got their first
// pull (info: 0 waiting, nothing delivered, all pending), and a resume
// waited for it as long as its connection lived.
func pullLost(info *jetstream.ConsumerInfo, dseq uint64) bool {
	return info.NumPending > 0 && info.NumWaiting == 0 && info.Delivered.Consumer == dseq
}

// checkAfter checks that a position to start after (0: before the first)
// is within the stream's retained history, and returns the stream's state.
func (b *JetStream) checkAfter(ctx context.Context, a uint64) (jetstream.StreamState, error) {
	info, err := b.stream.Info(ctx)
	if err != nil {
		return jetstream.StreamState{}, fmt.Errorf("jetstream: stream info: %w", err)
	}
	st := info.State
	switch {
	case a > st.LastSeq:
		return st, fmt.Errorf("%w: %s is ahead of the stream (last is %s)", ErrBadCursor, FormatJSCursor(a), FormatJSCursor(st.LastSeq))
	case a > 0 && a+1 < st.FirstSeq:
		return st, fmt.Errorf("%w: %s is older than the oldest retained event (%s)", ErrCursorExpired, FormatJSCursor(a), FormatJSCursor(st.FirstSeq))
	}
	return st, nil
}

const (
	// replayBatch is the pull window of a replay: the library asks for
	// more when half of it is consumed, so fetching overlaps delivery.
	replayBatch = 1024
	// replayStall is how long a replay waits for its next message before
	// it asks the server whether any is still to come.
	replayStall = 2 * time.Second
	// replayInactive is how long the server keeps a replay consumer
	// nobody reads from (one whose process died).
	replayInactive = time.Minute
)
