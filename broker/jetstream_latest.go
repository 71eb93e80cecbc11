package broker

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fanwire/fanwire/subject"
)

// Latest reads the newest stored message of each subject on filters (see
// Snapshots) and returns through, the stream's last sequence read before
// it: a subject published on after through is left out, for the Replay
// after through to deliver. It returns even while publishers keep the
// stream busy. With a limit, a set of more than limit messages is refused
// before any is delivered. How: docs/architecture.md, "JetStream: Latest".
func (b *JetStream) Latest(ctx context.Context, filters []string, limit int, h func([]Message) error) (string, error) {
	info, err := b.stream.Info(ctx)
	if err != nil {
		return "", fmt.Errorf("jetstream: stream info: %w", err)
	}
	last := info.State.LastSeq
	if last == 0 {
		return "", nil // nothing was ever stored
	}
	through := FormatJSCursor(last)
	if info.State.Msgs == 0 {
		return through, nil // all of it removed (retention, a purge)
	}
	if b.latest.afterThrough != nil {
		b.latest.afterThrough()
	}
	ccfg := jetstream.ConsumerConfig{
		DeliverPolicy:     jetstream.DeliverLastPerSubjectPolicy,
		AckPolicy:         jetstream.AckNonePolicy,
		InactiveThreshold: replayInactive,
		MemoryStorage:     true,
		Replicas:          1,
	}
	var loose bool // the consumer reads subjects off filters too
	ccfg.FilterSubject, ccfg.FilterSubjects, loose = b.latestFilters(filters)
	cons, err := b.js.CreateConsumer(ctx, b.cfg.Stream, ccfg)
	if err != nil {
		return "", fmt.Errorf("jetstream: latest consumer: %w", unsupported(err))
	}
	defer b.deleteShortLived(ctx, cons.CachedInfo().Name, "latest")
	pending := cons.CachedInfo().NumPending
	if pending == 0 {
		return through, nil // no subject on filters
	}
	if limit > 0 && !loose && pending > uint64(limit) {
		return "", snapshotTooLarge(limit, filters)
	}
	it, err := cons.Messages(jetstream.PullMaxMessages(replayBatch))
	if err != nil {
		return "", fmt.Errorf("jetstream: latest: %w", err)
	}
	// Next waits up to replayStall whatever ctx says: stopping the
	// iterator ends a wait at once when ctx is done. (it is replaced when
	// its pull was lost: see pullLost.)
	unwatch := context.AfterFunc(ctx, it.Stop)
	defer func() {
		unwatch()
		it.Stop()
	}()
	batch := make([]Message, 0, maxBatch)
	counted := 0    // messages on filters read so far
	var dseq uint64 // consumer sequence of the last message received (see Replay)
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		err := h(batch)
		clear(batch)
		batch = batch[:0]
		return err
	}
	done := func() (string, error) {
		if err := flush(); err != nil {
			return "", err
		}
		return through, nil
	}
	for {
		m, err := it.Next(jetstream.NextMaxWait(replayStall))
		if ctx.Err() != nil {
			return "", ctx.Err()
		}
		if errors.Is(err, nats.ErrTimeout) {
			// A slow server, or a message of the set removed since the
			// consumer took it (the count of pending ones still has it):
			// ask the server whether any is still to come.
			ci, err := cons.Info(ctx)
			if err != nil {
				return "", fmt.Errorf("jetstream: latest: %w", err)
			}
			if ci.NumPending == 0 {
				return done()
			}
			if pullLost(ci, dseq) {
				unwatch()
				it.Stop()
				if it, err = cons.Messages(jetstream.PullMaxMessages(replayBatch)); err != nil {
					return "", fmt.Errorf("jetstream: latest: %w", err)
				}
				unwatch = context.AfterFunc(ctx, it.Stop)
			}
			continue
		}
		if err != nil {
			return "", fmt.Errorf("jetstream: latest: %w", err)
		}
		meta, err := m.Metadata()
		if err != nil {
			return "", fmt.Errorf("jetstream: latest: %w", err)
		}
		if meta.Sequence.Consumer != dseq+1 { // a gap (see Replay)
			return "", fmt.Errorf("jetstream: latest: the server delivered messages that never arrived")
		}
		dseq = meta.Sequence.Consumer
		seq := meta.Sequence.Stream
		if seq > last {
			return done() // the rest of the set, and what follows it, is after through
		}
		if limit > 0 && (!loose || slices.ContainsFunc(filters, func(f string) bool { return subject.Match(f, m.Subject()) })) {
			if counted++; counted > limit {
				return "", snapshotTooLarge(limit, filters)
			}
		}
		batch = append(batch, Message{Subject: m.Subject(), Data: m.Data(), Cursor: FormatJSCursor(seq)})
		if seq == last || meta.NumPending == 0 {
			return done()
		}
		if len(batch) == cap(batch) {
			if err := flush(); err != nil {
				return "", err
			}
		}
	}
}

// latestFilters is consumerFilters for a last-per-subject consumer, which
// the server creates only with a filter: none means the subject space, and
// several on a server older than 2.10 (which takes one) mean ">", the
// whole stream (as Replay reads it there; the caller matches), which loose
// reports when the stream holds subjects off filters.
func (b *JetStream) latestFilters(filters []string) (one string, several []string, loose bool) {
	loose = len(filters) > 0
	if len(filters) == 0 {
		filters = b.cfg.Subjects
	}
	if len(filters) > 1 && !b.since210 {
		return ">", nil, loose
	}
	one, several = b.consumerFilters(filters)
	return one, several, false
}
