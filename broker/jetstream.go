package broker

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
)

// JetStreamConfig configures the JetStream broker: a NATS connection (as for
// Core NATS) and the stream that captures the subject space.
type JetStreamConfig struct {
	NATSConfig
	Stream     string        // stream name (default "FANWIRE")
	MaxAge     time.Duration // retention by age (0: unlimited)
	MaxBytes   int64         // retention by size (0: unlimited)
	Storage    string        // "file" (default) or "memory"
	Replicas   int           // stream replicas (default 1; 3 on a cluster)
	Duplicates time.Duration // deduplication window for publish ids (default 2m)
}

// JetStream is the durable NATS broker: every event is stored in a stream
// and carries a cursor "js:<stream sequence>".
type JetStream struct {
	core   *NATS // the connection, its state and logging
	js     jetstream.JetStream
	cfg    JetStreamConfig // static
	stream jetstream.Stream
}

// CursorPrefixJS starts every JetStream cursor.
const CursorPrefixJS = "js:"

// DialJetStream connects and creates or updates the stream. A stream that
// exists with settings fanwire cannot change (storage, retention policy) is
// an error naming the setting.
func DialJetStream(ctx context.Context, cfg JetStreamConfig) (*JetStream, error) {
	if cfg.Stream == "" {
		cfg.Stream = "FANWIRE"
	}
	if cfg.Storage == "" {
		cfg.Storage = "file"
	}
	if cfg.Replicas == 0 {
		cfg.Replicas = 1
	}
	if cfg.Duplicates == 0 {
		cfg.Duplicates = 2 * time.Minute
	}
	if len(cfg.Subjects) == 0 || slices.Contains(cfg.Subjects, ">") {
		// A stream on ">" would also capture the JetStream API and reply
		// subjects (the server refuses it unless acks are off).
		return nil, fmt.Errorf("jetstream: the stream needs an explicit subject space, not %q: set --subjects to your event subjects, e.g. db.>,app.>", strings.Join(cfg.Subjects, ","))
	}
	var storage jetstream.StorageType
	switch cfg.Storage {
	case "file":
		storage = jetstream.FileStorage
	case "memory":
		storage = jetstream.MemoryStorage
	default:
		return nil, fmt.Errorf("jetstream: storage %q: want file or memory", cfg.Storage)
	}
	core, err := DialNATS(ctx, cfg.NATSConfig)
	if err != nil {
		return nil, err
	}
	js, err := jetstream.New(core.nc)
	if err != nil {
		core.Close()
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	b := &JetStream{core: core, js: js, cfg: cfg}
	want := jetstream.StreamConfig{
		Name:       cfg.Stream,
		Subjects:   cfg.Subjects,
		Retention:  jetstream.LimitsPolicy,
		MaxAge:     cfg.MaxAge,
		MaxBytes:   max(cfg.MaxBytes, -1),
		Storage:    storage,
		Replicas:   cfg.Replicas,
		Duplicates: cfg.Duplicates,
		Discard:    jetstream.DiscardOld,
	}
	if cfg.MaxBytes == 0 {
		want.MaxBytes = -1
	}
	if b.stream, err = b.ensureStream(ctx, want); err != nil {
		core.Close()
		return nil, err
	}
	return b, nil
}

// ensureStream creates the stream, or updates what may change of an
// existing one, and says which it did.
func (b *JetStream) ensureStream(ctx context.Context, want jetstream.StreamConfig) (jetstream.Stream, error) {
	log := b.core.log
	s, err := b.js.Stream(ctx, want.Name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		s, err = b.js.CreateStream(ctx, want)
		if err != nil {
			return nil, fmt.Errorf("jetstream: create stream %q: %w", want.Name, err)
		}
		log.Info("created JetStream stream", zap.String("stream", want.Name), zap.Strings("subjects", want.Subjects),
			zap.String("storage", want.Storage.String()), zap.Duration("max_age", want.MaxAge), zap.Int64("max_bytes", want.MaxBytes))
		return s, nil
	}
	if err != nil {
		return nil, fmt.Errorf("jetstream: look up stream %q: %w", want.Name, err)
	}
	have := s.CachedInfo().Config
	switch {
	case have.Storage != want.Storage:
		return nil, fmt.Errorf("jetstream: stream %q exists with storage %s, not %s (storage cannot change: use another --stream)", want.Name, have.Storage, want.Storage)
	case have.Retention != jetstream.LimitsPolicy:
		return nil, fmt.Errorf("jetstream: stream %q exists with retention %s: fanwire needs limits retention (a work-queue or interest stream deletes events clients may resume from)", want.Name, have.Retention)
	}
	if slices.Equal(sortedCopy(have.Subjects), sortedCopy(want.Subjects)) && have.MaxAge == want.MaxAge &&
		have.MaxBytes == want.MaxBytes && have.Duplicates == want.Duplicates && have.Replicas == want.Replicas {
		log.Info("using JetStream stream", zap.String("stream", want.Name))
		return s, nil
	}
	upd := have
	upd.Subjects, upd.MaxAge, upd.MaxBytes, upd.Duplicates, upd.Replicas = want.Subjects, want.MaxAge, want.MaxBytes, want.Duplicates, want.Replicas
	s, err = b.js.UpdateStream(ctx, upd)
	if err != nil {
		return nil, fmt.Errorf("jetstream: update stream %q: %w", want.Name, err)
	}
	log.Info("updated JetStream stream", zap.String("stream", want.Name), zap.Strings("subjects", want.Subjects),
		zap.Duration("max_age", want.MaxAge), zap.Int64("max_bytes", want.MaxBytes))
	return s, nil
}

func sortedCopy(s []string) []string {
	c := slices.Clone(s)
	slices.Sort(c)
	return c
}

// FormatJSCursor returns the cursor of stream sequence seq.
func FormatJSCursor(seq uint64) string { return CursorPrefixJS + strconv.FormatUint(seq, 10) }

// ParseJSCursor returns the stream sequence of a JetStream cursor.
func ParseJSCursor(c string) (uint64, error) {
	s, ok := strings.CutPrefix(c, CursorPrefixJS)
	if !ok {
		return 0, fmt.Errorf("%w: %q is not a JetStream cursor (js:<sequence>)", ErrBadCursor, c)
	}
	seq, err := strconv.ParseUint(s, 10, 64)
	if err != nil || seq == 0 || (len(s) > 1 && s[0] == '0') {
		return 0, fmt.Errorf("%w: %q: the sequence must be a positive decimal integer", ErrBadCursor, c)
	}
	return seq, nil
}

// Publish publishes msgs with their ids as Nats-Msg-Id (the stream's
// duplicate window drops a repeat and acks it with the original sequence),
// pipelined, and returns when every one is acknowledged.
func (b *JetStream) Publish(ctx context.Context, msgs []Outgoing) ([]string, error) {
	cursors := make([]string, len(msgs))
	futures := make([]jetstream.PubAckFuture, 0, min(len(msgs), publishWindow))
	for start := 0; start < len(msgs); start += publishWindow {
		// At most publishWindow acks outstanding: the client stalls, then
		// fails, past 4,000 (nats.go's default).
		window := msgs[start:min(start+publishWindow, len(msgs))]
		futures = futures[:0]
		for _, m := range window {
			var opts []jetstream.PublishOpt
			if m.ID != "" {
				opts = append(opts, jetstream.WithMsgID(m.ID))
			}
			f, err := b.js.PublishAsync(m.Subject, m.Data, opts...)
			if err != nil {
				return nil, fmt.Errorf("jetstream publish %q: %w", m.Subject, err)
			}
			futures = append(futures, f)
		}
		for i, f := range futures {
			select {
			case ack := <-f.Ok():
				cursors[start+i] = FormatJSCursor(ack.Sequence)
			case err := <-f.Err():
				return nil, fmt.Errorf("jetstream publish %q: %w", window[i].Subject, err)
			case <-ctx.Done():
				return nil, fmt.Errorf("jetstream publish: waiting for acks: %w", ctx.Err())
			}
		}
	}
	return cursors, nil
}

// publishWindow bounds the acks Publish waits for at once.
const publishWindow = 1024

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
	cons, err := b.js.OrderedConsumer(ctx, b.cfg.Stream, jetstream.OrderedConsumerConfig{
		FilterSubjects: b.cfg.Subjects,
		DeliverPolicy:  jetstream.DeliverByStartSequencePolicy,
		OptStartSeq:    last + 1,
	})
	if err != nil {
		return fmt.Errorf("jetstream: ordered consumer on %q: %w", b.cfg.Stream, err)
	}
	start := ""
	if last > 0 {
		start = FormatJSCursor(last)
	}
	return b.run(ctx, cons, h, func() {
		if started != nil {
			started(start)
		}
	})
}

// run consumes cons, batching messages to h, until ctx is done.
func (b *JetStream) run(ctx context.Context, cons jetstream.Consumer, h Handler, started func()) error {
	ch := make(chan Message, consumeBuffer)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	cc, err := cons.Consume(func(m jetstream.Msg) {
		meta, err := m.Metadata()
		if err != nil {
			b.core.log.Warn("jetstream message without metadata", zap.Error(err))
			return
		}
		select { // blocking: a slow dispatcher makes the consumer stop pulling
		case ch <- Message{Subject: m.Subject(), Data: m.Data(), Cursor: FormatJSCursor(meta.Sequence.Stream)}:
		case <-ctx.Done():
		}
	}, jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
		b.core.log.Debug("jetstream consume", zap.Error(err))
	}))
	if err != nil {
		return fmt.Errorf("jetstream: consume %q: %w", b.cfg.Stream, err)
	}
	defer func() {
		cancel() // unblocks a handler waiting to send
		cc.Stop()
		<-cc.Closed()
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

// Ready reports whether the connection is up.
func (b *JetStream) Ready() bool { return b.core.Ready() }

// Close closes the connection.
func (b *JetStream) Close() error { return b.core.Close() }

// CompareCursors orders two JetStream cursors.
func (b *JetStream) CompareCursors(x, y string) (int, error) {
	a, err := ParseJSCursor(x)
	if err != nil {
		return 0, err
	}
	c, err := ParseJSCursor(y)
	if err != nil {
		return 0, err
	}
	return cmp.Compare(a, c), nil
}

// Replay reads the stream from the sequence after `after` up to `until`
// (the watermark) through a short-lived consumer.
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
		DeliverPolicy:  jetstream.DeliverAllPolicy,
		AckPolicy:      jetstream.AckNonePolicy,
		FilterSubjects: filters,
		// Removed by the server if this process dies before deleting it.
		InactiveThreshold: replayInactive,
		MemoryStorage:     true,
		Replicas:          1,
	}
	if a > 0 {
		ccfg.DeliverPolicy, ccfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, a+1
	}
	cons, err := b.js.CreateConsumer(ctx, b.cfg.Stream, ccfg)
	if err != nil {
		return fmt.Errorf("jetstream: replay consumer: %w", err)
	}
	defer func() {
		// Best effort, detached from ctx (a cancelled resume still cleans
		// up); the inactivity threshold covers a failure.
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := b.js.DeleteConsumer(dctx, b.cfg.Stream, cons.CachedInfo().Name); err != nil {
			b.core.log.Debug("jetstream: delete replay consumer", zap.Error(err))
		}
	}()
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
	defer it.Stop()
	batch := make([]Message, 0, maxBatch)
	for {
		m, err := it.Next(jetstream.NextContext(ctx))
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
		seq := meta.Sequence.Stream
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
	// replayInactive is how long the server keeps a replay consumer
	// nobody reads from (one whose process died).
	replayInactive = time.Minute
)
