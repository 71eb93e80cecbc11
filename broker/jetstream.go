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

	"github.com/nats-io/nats.go"
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

// Replay reads the stream with a short-lived ordered consumer from the
// sequence after `after` and stops at `until` (the watermark).
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
	info, err := b.stream.Info(ctx)
	if err != nil {
		return fmt.Errorf("jetstream: stream info: %w", err)
	}
	st := info.State
	switch {
	case a > st.LastSeq:
		return fmt.Errorf("%w: %s is ahead of the stream (last is %s)", ErrBadCursor, after, FormatJSCursor(st.LastSeq))
	case after != "" && a+1 < st.FirstSeq:
		return fmt.Errorf("%w: %s is older than the oldest retained event (%s)", ErrCursorExpired, after, FormatJSCursor(st.FirstSeq))
	case u <= a:
		return nil
	}
	ocfg := jetstream.OrderedConsumerConfig{FilterSubjects: filters, DeliverPolicy: jetstream.DeliverAllPolicy}
	if a > 0 {
		ocfg.DeliverPolicy, ocfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, a+1
	}
	cons, err := b.js.OrderedConsumer(ctx, b.cfg.Stream, ocfg)
	if err != nil {
		return fmt.Errorf("jetstream: replay consumer: %w", err)
	}
	batch := make([]Message, 0, maxBatch)
	for {
		// FetchNoWait answers at once with what is stored: everything up
		// to until is. An empty answer is not always the end, though (see
		// below).
		mb, err := cons.FetchNoWait(replayBatch)
		if err != nil {
			return fmt.Errorf("jetstream: replay fetch: %w", err)
		}
		got, done := 0, false
		var metaErr error
		for m := range mb.Messages() { // drained to the end: the fetch's goroutine exits with it
			got++
			meta, err := m.Metadata()
			if err != nil {
				metaErr = err
				continue
			}
			if done || meta.Sequence.Stream > u {
				done = true
				continue
			}
			batch = append(batch, Message{Subject: m.Subject(), Data: m.Data(), Cursor: FormatJSCursor(meta.Sequence.Stream)})
			if meta.Sequence.Stream == u || meta.NumPending == 0 {
				done = true
			}
		}
		if metaErr != nil {
			return fmt.Errorf("jetstream: replay: %w", metaErr)
		}
		if err := mb.Error(); err != nil && !errors.Is(err, jetstream.ErrNoMessages) && !errors.Is(err, nats.ErrTimeout) {
			return fmt.Errorf("jetstream: replay fetch: %w", err)
		}
		if len(batch) > 0 {
			if err := h(batch); err != nil {
				return err
			}
			clear(batch)
			batch = batch[:0]
		}
		if done {
			return ctx.Err()
		}
		if got == 0 {
			// nats.go also ends a no-wait fetch with no messages and no
			// error when the server's answer has not come within 1 s: on
			// the loaded 2-core machine, replays of a few hundred events
			// ended so, and the resume handed over at the watermark with
			// those events missing (the loadtest's --resume caught it).
			// The consumer this fetch created knows how many messages on
			// the filters the stream held after our position: none is
			// the end, any means fetch again (the next fetch restarts
			// after the last message we got).
			info := cons.CachedInfo()
			if info == nil {
				return errors.New("jetstream: replay: the consumer has no info")
			}
			if info.NumPending == 0 {
				return ctx.Err()
			}
			if err := ctx.Err(); err != nil {
				return err
			}
		}
	}
}

// replayBatch is the number of messages one replay fetch asks for: each
// fetch is a round trip to the server.
const replayBatch = 1024
