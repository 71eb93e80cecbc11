package broker

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
)

// JetStreamConfig configures the JetStream broker: a NATS connection (as for
// Core NATS) and the stream that captures the subject space.
type JetStreamConfig struct {
	NATSConfig
	Stream   string        // stream name (default "FANWIRE")
	MaxAge   time.Duration // retention by age (0: unlimited)
	MaxBytes int64         // retention by size (0: unlimited)
	Storage  string        // "file" (default) or "memory"
	Replicas int           // stream replicas, 3 on a cluster (0: an existing stream keeps its own, a new one gets 1)
	// Duplicates is the least deduplication window for publish ids
	// (default 2m): a stream whose window is longer (an operator's choice)
	// keeps it.
	Duplicates time.Duration
	// OnGap is called with the number of events the live feed skipped
	// because they were removed from the stream before it read them (a
	// long outage outlived retention): they cannot be delivered, so they
	// are counted.
	OnGap func(n int)
}

// JetStream is the durable NATS broker: every event is stored in a stream
// and carries a cursor "js:<stream sequence>".
type JetStream struct {
	core   *NATS // the connection, its state and logging
	js     jetstream.JetStream
	cfg    JetStreamConfig        // static
	want   jetstream.StreamConfig // static: the stream's settings, to re-create it when it is lost
	stream jetstream.Stream
	buffer int         // messages the live feed holds for a busy handler (consumeBuffer; tests make it small)
	latest latestHooks // static: tests' hooks into Latest

	// atomic is whether the stream takes atomic batches (see Publish): set
	// by DialJetStream, cleared when the server refuses one as disabled.
	atomic atomic.Bool
	// batchMax is the largest window Publish sends as one batch:
	// publishWindow, halved each time the server says it is over its limit.
	batchMax atomic.Int32

	// version is the server's (static after DialJetStream); since210 is
	// whether it is NATS 2.10 or newer, which takes several filter
	// subjects on one consumer and keeps a stream's first_seq.
	version  string
	since210 bool

	// fast is whether the stream takes fast batches (see Append): set by
	// DialJetStream, cleared when the server refuses one as disabled.
	fast atomic.Bool
	// fastInbox prefixes the reply subjects of fast batches; fastSub, on
	// everything under it, routes the server's answers to the waiting
	// Append by batch id (fastCalls).
	fastInbox string
	fastSub   *nats.Subscription
	fastMu    sync.Mutex
	fastCalls map[string]*fastCall // guarded by fastMu
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
	version := core.nc.ConnectedServerVersion()
	if !serverAtLeast(version, 2, 9) {
		core.Close()
		return nil, fmt.Errorf("jetstream: nats-server %s is too old: fanwire needs nats-server 2.9.0 or newer (see Supported versions in README.md)", version)
	}
	js, err := jetstream.New(core.nc, jetstream.WithPublishAsyncTimeout(publishAckTimeout))
	if err != nil {
		core.Close()
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	b := &JetStream{core: core, js: js, cfg: cfg, version: version, since210: serverAtLeast(version, 2, 10)}
	if storage == jetstream.MemoryStorage && !b.since210 {
		// A memory stream is lost with a restart; re-created, it must be
		// numbered on after its last event (first_seq, NATS 2.10+), or the
		// live feeds, past those numbers, skip its events.
		core.Close()
		return nil, fmt.Errorf("jetstream: storage memory needs nats-server 2.10 or newer (this one is %s): use storage file", version)
	}
	if !b.since210 && len(cfg.Subjects) > 1 {
		core.log.Info("jetstream: the server takes one filter subject per consumer (NATS older than 2.10): replays and subscription consumers on several patterns read the whole stream and fanwire filters",
			zap.String("version", version))
	}
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
		// Publish sends atomic batches (NATS 2.12+; an older server
		// ignores the setting, and Publish then goes a message at a time).
		AllowAtomicPublish: true,
		// Append sends fast batches (NATS 2.14+; an older server ignores
		// the setting, and Append is then Publish).
		AllowBatchPublish: true,
	}
	if cfg.MaxBytes == 0 {
		want.MaxBytes = -1
	}
	if b.stream, err = b.ensureStream(ctx, want); err != nil {
		core.Close()
		return nil, err
	}
	b.want = want
	b.want.Replicas = b.stream.CachedInfo().Config.Replicas
	b.want.Duplicates = b.stream.CachedInfo().Config.Duplicates
	b.batchMax.Store(publishWindow)
	b.atomic.Store(b.stream.CachedInfo().Config.AllowAtomicPublish)
	if !b.atomic.Load() {
		b.core.log.Warn("jetstream: the server does not take atomic batches (NATS older than 2.12?): publishing one message at a time, in order, which is much slower",
			zap.String("stream", want.Name))
	}
	b.fast.Store(b.stream.CachedInfo().Config.AllowBatchPublish)
	if !b.fast.Load() {
		b.core.log.Info("jetstream: the server does not take fast batches (NATS older than 2.14?): Append publishes as Publish does",
			zap.String("stream", want.Name))
	}
	b.fastCalls = make(map[string]*fastCall)
	b.fastInbox = core.nc.NewInbox()
	if b.fastSub, err = core.nc.Subscribe(b.fastInbox+".>", b.fastReply); err != nil {
		core.Close()
		return nil, fmt.Errorf("jetstream: subscribe to fast batch answers: %w", err)
	}
	return b, nil
}

// ensureStream creates the stream, or updates what may change of an
// existing one, and says which it did.
func (b *JetStream) ensureStream(ctx context.Context, want jetstream.StreamConfig) (jetstream.Stream, error) {
	log := b.core.log
	s, err := b.js.Stream(ctx, want.Name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		want.Replicas = max(want.Replicas, 1)
		s, err = b.js.CreateStream(ctx, want)
		if err != nil {
			return nil, fmt.Errorf("jetstream: create stream %q: %w", want.Name, err)
		}
		log.Info("created JetStream stream", zap.String("stream", want.Name), zap.Strings("subjects", want.Subjects),
			zap.String("storage", want.Storage.String()), zap.Duration("max_age", want.MaxAge), zap.Int64("max_bytes", want.MaxBytes),
			zap.Int("replicas", want.Replicas))
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
	// Replicas left at 0 keep the stream's own count: defaulting to 1
	// would shrink an R3 stream an operator made to one replica.
	if want.Replicas == 0 {
		want.Replicas = have.Replicas
	}
	// Our window is a floor: a longer one an operator set (to deduplicate
	// over a longer outage) stays, unless our MaxAge is shorter (the
	// server wants the window within it).
	if have.Duplicates > want.Duplicates {
		want.Duplicates = have.Duplicates
		if want.MaxAge > 0 {
			want.Duplicates = max(min(want.Duplicates, want.MaxAge), b.cfg.Duplicates)
		}
	}
	if slices.Equal(sortedCopy(have.Subjects), sortedCopy(want.Subjects)) && have.MaxAge == want.MaxAge &&
		have.MaxBytes == want.MaxBytes && have.Duplicates == want.Duplicates && have.Replicas == want.Replicas &&
		// A server without atomic (2.12) or fast (2.14) batches does not
		// keep the settings: updating would not change them.
		(have.AllowAtomicPublish == want.AllowAtomicPublish || !serverAtLeast(b.version, 2, 12)) &&
		(have.AllowBatchPublish == want.AllowBatchPublish || !serverAtLeast(b.version, 2, 14)) {
		log.Info("using JetStream stream", zap.String("stream", want.Name))
		return s, nil
	}
	upd := have
	upd.Subjects, upd.MaxAge, upd.MaxBytes, upd.Duplicates, upd.Replicas = want.Subjects, want.MaxAge, want.MaxBytes, want.Duplicates, want.Replicas
	upd.AllowAtomicPublish, upd.AllowBatchPublish = want.AllowAtomicPublish, want.AllowBatchPublish
	s, err = b.js.UpdateStream(ctx, upd)
	if err != nil {
		return nil, fmt.Errorf("jetstream: update stream %q: %w", want.Name, err)
	}
	log.Info("updated JetStream stream", zap.String("stream", want.Name), zap.Strings("subjects", want.Subjects),
		zap.Duration("max_age", want.MaxAge), zap.Int64("max_bytes", want.MaxBytes), zap.Int("replicas", want.Replicas))
	return s, nil
}

// consumerFilters is how a consumer filters on filters: one as its filter
// subject (every server), several as its filter subjects on NATS 2.10 and
// newer. A server older than 2.10 ignores filter subjects (and the library
// then refuses the consumer it made), so there several filter on nothing:
// the consumer reads the whole stream, whose subjects are the subject
// space, and the caller, which matches every message, drops the others.
func (b *JetStream) consumerFilters(filters []string) (one string, several []string) {
	switch {
	case len(filters) == 1:
		return filters[0], nil
	case len(filters) > 1 && b.since210:
		return "", filters
	}
	return "", nil
}

// unsupported marks the library's errors about a feature the server lacks
// as ErrUnsupported, so that callers stop retrying; other errors pass as
// they are.
func unsupported(err error) error {
	for _, e := range []error{
		jetstream.ErrConsumerMultipleFilterSubjectsNotSupported,
		jetstream.ErrStreamSubjectTransformNotSupported,
		jetstream.ErrStreamSourceNotSupported,
		jetstream.ErrStreamSourceMultipleFilterSubjectsNotSupported,
	} {
		if errors.Is(err, e) {
			return fmt.Errorf("%w: %w", ErrUnsupported, err)
		}
	}
	return err
}

// serverAtLeast reports whether a nats-server version ("2.9.10",
// "2.11.0-RC.1") is at least major.minor.
func serverAtLeast(version string, major, minor int) bool {
	parts := strings.SplitN(version, ".", 3)
	if len(parts) < 2 {
		return false
	}
	ma, err1 := strconv.Atoi(parts[0])
	mi, err2 := strconv.Atoi(strings.TrimRightFunc(parts[1], func(r rune) bool { return r < '0' || r > '9' }))
	if err1 != nil || err2 != nil {
		return false
	}
	return ma > major || ma == major && mi >= minor
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

// Ready reports whether the connection is up.
func (b *JetStream) Ready() bool { return b.core.Ready() }

// Name returns "jetstream".
func (b *JetStream) Name() string { return "jetstream" }

// Close ends the subscription to fast batch answers and closes the
// connection.
func (b *JetStream) Close() error {
	_ = b.fastSub.Unsubscribe()
	return b.core.Close()
}

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
