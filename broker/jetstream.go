package broker

import (
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

	// pubFinds counts the fast-batch Publishes whose messages were not
	// stored contiguously (findTagged), pubTagReads the messages read back
	// (storedTag): for tests.
	pubFinds    atomic.Int64
	pubTagReads atomic.Int64
	pubHooks    struct{ afterFirst func() } // static: tests' hooks into Publish

	// seqSeen is the highest stream sequence this broker was told is
	// stored (observe): a fast batch sent after reading it is stored
	// after it, which bounds its search (findTagged).
	seqSeen atomic.Uint64
}

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
	// No reconnect buffer: a publish while the connection is down fails at
	// once (Publish and Append send again themselves), and nothing a
	// writer sent lands after its next run read its high-water mark
	// (docs/ingest.md, "The high-water mark").
	core, err := dialNATS(ctx, cfg.NATSConfig, nats.ReconnectBufSize(-1))
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
	b.observe(b.stream.CachedInfo().State.LastSeq)
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

// observe records that the stream stores a message at seq (an answer to
// a publish, a message of the live feed, the stream's state).
func (b *JetStream) observe(seq uint64) {
	for {
		old := b.seqSeen.Load()
		if seq <= old || b.seqSeen.CompareAndSwap(old, seq) {
			return
		}
	}
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
