package cdc

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fanwire/fanwire/broker"
	"github.com/fanwire/fanwire/cdc/pgjson"
	"github.com/fanwire/fanwire/metrics"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
)

// Ingest is the ingest role. Run it with Run.
type Ingest struct {
	cfg Config
	log *zap.Logger

	ready     atomic.Bool
	standby   atomic.Bool               // waiting for the slot's lock (another ingest leads)
	takeovers atomic.Uint64             // times this ingest took the lock after waiting
	confirmed atomic.Uint64             // the LSN confirmed to PostgreSQL
	mem       atomic.Pointer[memState]  // the memory projections' state, for MemoryState
	walEnd    atomic.Uint64             // the server's WAL end, last reported
	published atomic.Uint64             // events the broker acknowledged
	bootRows  atomic.Uint64             // rows published by bootstraps
	oldest    atomic.Int64              // commit time (Unix ns) of the oldest transaction not yet acknowledged; 0: none
	badRows   [badReasons]atomic.Uint64 // error events published instead of rows, by reason (badValue, badTooLarge)
	queue     atomic.Pointer[budget]    // the current publisher's, for the queue metrics
	spilled   atomic.Uint64             // transactions moved to a spill file
	spillB    atomic.Uint64             // bytes written to spill files
	marksLost atomic.Uint64             // starts that found no high-water mark of a writer that had stored events

	// writer is the ingest's writer name (writers.go), which starts every
	// event id: set by each run before its reader, publisher and
	// bootstrap start, the same every run (until the database is restored
	// into a new cluster).
	writer string

	// maxEvent is the broker's message size limit (0: none); static after New.
	maxEvent int

	wal metrics.WAL // pgoutput messages by kind and route; the reader owns it

	// commitToAck is the time from a transaction's commit in PostgreSQL to
	// the broker's ack of its events (decode, projection, batching and
	// publish: the ingest's share of commit-to-client latency).
	commitToAck prometheus.Histogram
}

// lagSeconds is how long the oldest unacknowledged transaction has waited
// since its commit.
func (in *Ingest) lagSeconds() float64 {
	t := in.oldest.Load()
	if t == 0 {
		return 0
	}
	return max(0, time.Since(time.Unix(0, t)).Seconds())
}

// New validates cfg.
func New(cfg Config) (*Ingest, error) {
	cfg.setDefaults()
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("ingest config: %w", err)
	}
	maxEvent := 0
	if l, ok := cfg.Broker.(broker.Limited); ok {
		maxEvent = l.MaxMessage()
	}
	return &Ingest{cfg: cfg, log: cfg.Logger, maxEvent: maxEvent, commitToAck: prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "fanwire_ingest_commit_to_ack_seconds",
		Help:    "Time from a transaction's commit in PostgreSQL to the broker's ack of its events.",
		Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16), // 0.5 ms to 16 s
	})}, nil
}

// Ready reports whether the ingest is tailing the slot.
func (in *Ingest) Ready() bool { return in.ready.Load() }

// Standby reports whether the ingest is waiting for another ingest of the
// same slot to end.
func (in *Ingest) Standby() bool { return in.standby.Load() }

// MemoryState reports the rows the memory-mode projections hold and the
// bytes of their values (0, 0 without).
func (in *Ingest) MemoryState() (rows, valueBytes int64) {
	if s := in.mem.Load(); s != nil {
		return s.stats()
	}
	return 0, 0
}

// Confirmed is the LSN last confirmed to PostgreSQL.
func (in *Ingest) Confirmed() pglogrepl.LSN { return pglogrepl.LSN(in.confirmed.Load()) }

// Published is the number of events the broker has acknowledged.
func (in *Ingest) Published() uint64 { return in.published.Load() }

// writerSubjects are the subjects the ingest publishes on (writers.go):
// those of the tables whose events it publishes (keys), and of its
// projections.
func (in *Ingest) writerSubjects(keys map[string][]string, docs *docEngine) []string {
	var out []string
	for _, q := range slices.Sorted(maps.Keys(keys)) {
		schema, name := splitTable(q)
		out = append(out, subjectsOf(in.cfg.Prefix, tableSubject(in.cfg.Prefix, schema, name))...)
	}
	if docs != nil {
		for _, p := range docs.projs {
			out = append(out, subjectsOf(in.cfg.Prefix, p.subject)...)
		}
	}
	return out
}

// stopTimeout bounds a clean stop: the time the reader has to hand over
// what it decoded, have the broker acknowledge it and confirm it.
const stopTimeout = 10 * time.Second

// errFatal marks errors that a reconnect cannot fix (configuration).
type errFatal struct{ error }

func (e errFatal) Unwrap() error { return e.error }

// Run ingests until ctx is done. A lost connection (PostgreSQL restarted,
// the network) is retried after Config.Retry, resuming from the slot;
// configuration errors end it.
func (in *Ingest) Run(ctx context.Context) error {
	for {
		err := in.runOnce(ctx)
		in.ready.Store(false)
		if ctx.Err() != nil {
			return nil
		}
		var fatal errFatal
		if errors.As(err, &fatal) {
			return fatal.error
		}
		in.log.Warn("ingest: connection lost; reconnecting", zap.Error(err), zap.Duration("after", in.cfg.Retry))
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(in.cfg.Retry):
		}
	}
}

// runOnce connects, sets up, bootstraps when the slot is new, and tails.
// It ends with an error when this ingest loses the slot's lock.
func (in *Ingest) runOnce(parent context.Context) (err error) {
	// When parent ends, a run that is tailing stops cleanly: the reader
	// hands over what it has, waits for the broker's acks and confirms
	// them to PostgreSQL (reader.stop), within stopTimeout; a run still
	// setting up stops at once.
	ctx, cancel := context.WithCancelCause(context.WithoutCancel(parent))
	defer cancel(nil)
	var tailing atomic.Bool
	stopping, stopNow := context.WithCancel(context.Background())
	defer stopNow()
	var stopTimer *time.Timer
	var timerMu sync.Mutex
	unwatch := context.AfterFunc(parent, func() {
		if !tailing.Load() {
			cancel(parent.Err())
			return
		}
		stopNow()
		timerMu.Lock()
		stopTimer = time.AfterFunc(stopTimeout, func() {
			cancel(fmt.Errorf("stopping took over %v: what was not acknowledged is read again at the next start", stopTimeout))
		})
		timerMu.Unlock()
	})
	defer func() {
		if !unwatch() { // it ran: stop its timer, if any
			timerMu.Lock()
			if stopTimer != nil {
				stopTimer.Stop()
			}
			timerMu.Unlock()
		}
	}()
	defer func() {
		// The lock was lost, or a publish failed, and that canceled what
		// was under way: its cause says why, not the cancellation.
		if parent.Err() == nil && ctx.Err() != nil && (err == nil || errors.Is(err, context.Canceled)) {
			err = context.Cause(ctx)
		}
	}()
	cfg := &in.cfg
	ccfg, err := connConfig(cfg.DSN)
	if err != nil {
		return err
	}
	conn, err := pgx.ConnectConfig(ctx, ccfg)
	if err != nil {
		return fmt.Errorf("postgres: connect: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	srv, err := checkServer(ctx, conn)
	if err != nil {
		return errFatal{err}
	}
	// Lead first: everything below (the publication, the slot, a
	// bootstrap, the memory state's file) belongs to one ingest at a time.
	lease, release, err := in.lead(ctx, ccfg, srv.version, cancel)
	if err != nil {
		return err
	}
	defer release()
	// Spill files of a previous run (a crash leaves them) are this slot's
	// leader's to remove: a standby sharing the directory never does.
	if n, err := removeSpillFiles(cfg.StateDir, cfg.Slot); err != nil {
		return err
	} else if n > 0 {
		in.log.Info("ingest: removed spill files left by a previous run", zap.Int("files", n), zap.String("dir", cfg.StateDir))
	}
	// Projections are checked against the catalog first. The publication
	// holds their tables too, but only the tables --tables names publish
	// table events.
	// The column types, looked up once each on every path that reads
	// values: projections, the bootstrap, the tail. The cache has no lock:
	// it is this goroutine's (the start-up and the bootstrap, then the
	// reader, which runs here).
	types := pgjson.NewTypeCache()
	var docs *docEngine
	pubTables := cfg.Tables
	if len(cfg.Projections) > 0 {
		if docs, err = in.newDocEngine(ctx, conn, types); err != nil {
			return err
		}
		defer docs.close()
		pubTables = slices.Concat(cfg.Tables, projectionTables(cfg.Projections))
	}
	keys, oids, err := ensurePublication(ctx, conn, cfg.Publication, pubTables)
	if err != nil {
		return errFatal{err}
	}
	if docs != nil {
		keys = tableEventKeys(keys, cfg.Tables)
	}
	// The tables whose table events are published: those --tables names,
	// by OID (a rename keeps it); without --tables or projections, every
	// table the publication sends, also one created later (nil).
	var only map[uint32]bool
	if len(cfg.Tables) > 0 || docs != nil {
		only = make(map[uint32]bool, len(keys))
		for q := range keys {
			only[oids[q]] = true
		}
	}
	st, err := in.waitSlotFree(ctx, conn)
	if err != nil {
		return err
	}
	if lsn, mem := docs.memLSN(); mem && st.exists && st.bootstrapped && !cfg.Rebootstrap {
		switch {
		case lsn == 0:
			in.log.Warn("ingest: the memory projections' state is missing or was built for other projections; bootstrapping again", zap.String("slot", cfg.Slot))
			st.bootstrapped = false
		case lsn < st.confirmed:
			// The state is written before its LSN is confirmed, so a state
			// behind the slot missed changes: another host's ingest led
			// meanwhile (its --state-dir is not shared), or the file was
			// restored from a backup.
			in.log.Warn("ingest: the memory projections' state is behind the slot (another ingest led with another --state-dir?); bootstrapping again",
				zap.String("slot", cfg.Slot), zap.Stringer("state_lsn", lsn), zap.Stringer("slot_confirmed_lsn", st.confirmed))
			st.bootstrapped = false
		}
	}
	if st.exists && (cfg.Rebootstrap || !st.bootstrapped) {
		if !st.bootstrapped {
			in.log.Warn("ingest: the slot's bootstrap never finished; starting over", zap.String("slot", cfg.Slot))
		}
		if err := dropSlot(ctx, conn, cfg.Slot); err != nil {
			return err
		}
		cfg.Rebootstrap = false
		st.exists = false
	}

	rcfg, err := replicationConfig(cfg.DSN)
	if err != nil {
		return err
	}
	rconn, err := pgconn.ConnectConfig(ctx, rcfg)
	if err != nil {
		return fmt.Errorf("postgres: replication connection: %w", err)
	}
	defer rconn.Close(context.WithoutCancel(ctx))

	// The writer: its name starts every event id; its subjects are
	// registered in the broker, refused if another ingest publishes on
	// them.
	sys, err := pglogrepl.IdentifySystem(ctx, rconn)
	if err != nil {
		return fmt.Errorf("postgres: identify system: %w", err)
	}
	if in.writer, err = writerName(cfg.Slot, sys.SystemID); err != nil {
		return errFatal{err}
	}
	r := &reader{in: in, conn: rconn, streamed: make(map[uint32]*txn), hbConn: conn, docs: docs}
	r.enc.writer = in.writer
	subjects := in.writerSubjects(keys, docs)
	all, stored := subjects, false
	if rb, ok := cfg.Broker.(broker.Registry); ok {
		reg := &registration{reg: rb, name: in.writer, log: in.log, rec: writerRecord{
			Slot: cfg.Slot, System: sys.SystemID, Database: ccfg.Database, Host: hostOf(ccfg.Host, ccfg.Port), Prefix: cfg.Prefix,
		}}
		if err := reg.update(ctx, func(rec *writerRecord) {
			rec.Subjects, rec.Until = subjects, time.Now().Add(writerTTL)
		}); err != nil {
			if errors.Is(err, errWriterConflict) {
				return errFatal{err}
			}
			return fmt.Errorf("broker: register this ingest: %w", err)
		}
		kctx, stopKeep := context.WithCancel(ctx)
		kept := make(chan struct{})
		go func() {
			defer close(kept)
			reg.keep(kctx, func() bool { return in.published.Load() > 0 }, cancel)
		}()
		defer func() {
			stopKeep()
			<-kept
			if parent.Err() != nil { // the ingest stops: another may take its subjects now
				rctx, done := context.WithTimeout(context.WithoutCancel(parent), 5*time.Second)
				reg.release(rctx)
				done()
			}
		}()
		all, stored = reg.subjects(), reg.stored()
		r.reg = reg
	}
	in.log.Info("ingest: writer", zap.String("writer", in.writer), zap.String("system", sys.SystemID), zap.Strings("subjects", subjects))

	// A slot that exists is read again from its confirmed LSN: the
	// broker's high-water mark says what of that it has. (A new slot is
	// bootstrapped, and its changes are all after any mark.)
	lastID, hw, rp, err := in.learnHighWater(ctx, conn, st.exists, all, stored)
	if err != nil {
		return err
	}
	if lastID != "" && r.reg != nil && !stored {
		// Recorded now rather than at the keeper's next renewal: a mark
		// lost from here on is told as lost.
		if err := r.reg.update(ctx, func(rec *writerRecord) { rec.Stored = true }); err != nil {
			in.log.Warn("ingest: record in the broker's registry that this ingest has stored events", zap.Error(err))
		}
	}
	pub := newPublisher(in, lease, hw, lastID, cancel)
	pctx, stopPub := context.WithCancel(ctx)
	pubDone := make(chan struct{})
	go func() {
		defer close(pubDone)
		pub.run(pctx)
	}()
	defer func() {
		stopPub()
		<-pubDone
	}()

	// Late bootstraps (lateboot.go) run beside the reader; they stop
	// before the publisher does.
	lctx, lcancel := context.WithCancel(ctx)
	var lwg sync.WaitGroup
	defer func() {
		lcancel()
		lwg.Wait()
	}()
	r.late = make(map[uint32]*lateBoot)
	r.lateRun = func(lb *lateBoot) { lwg.Go(func() { in.lateBootstrap(lctx, lb, pub) }) }

	var start pglogrepl.LSN
	if !st.exists {
		res, err := pglogrepl.CreateReplicationSlot(ctx, rconn, cfg.Slot, "pgoutput",
			pglogrepl.CreateReplicationSlotOptions{SnapshotAction: "EXPORT_SNAPSHOT"})
		if err != nil {
			return fmt.Errorf("postgres: create slot %q: %w", cfg.Slot, err)
		}
		if start, err = pglogrepl.ParseLSN(res.ConsistentPoint); err != nil {
			return fmt.Errorf("postgres: slot %q consistent point %q: %w", cfg.Slot, res.ConsistentPoint, err)
		}
		in.log.Info("ingest: created slot; bootstrapping", zap.String("slot", cfg.Slot), zap.Stringer("consistent_point", start))
		// The snapshot lives until the replication connection runs its next
		// command: bootstrap before starting replication.
		if err := in.bootstrap(ctx, conn, keys, oids, docs, types, res.SnapshotName, start, pub); err != nil {
			return err
		}
		r.booted = make(map[uint32]pglogrepl.LSN, len(keys))
		for q := range keys {
			r.booted[oids[q]] = start
		}
	} else {
		var legacy bool
		if r.booted, legacy = bootedTables(st, keys, oids); legacy {
			if err := recordTables(ctx, conn, cfg.Slot, r.booted); err != nil {
				return err
			}
		}
		if err := in.bootstrapNewProjections(ctx, conn, docs, st, pub); err != nil {
			return err
		}
	}
	proto, extra := "1", []string(nil)
	if srv.version >= 140000 {
		proto, extra = "2", []string{"streaming 'true'"}
	}
	args := append([]string{
		"proto_version '" + proto + "'",
		"publication_names '" + cfg.Publication + "'",
		"messages 'true'",
	}, extra...)
	if err := pglogrepl.StartReplication(ctx, rconn, cfg.Slot, start, pglogrepl.StartReplicationOptions{PluginArgs: args}); err != nil {
		return fmt.Errorf("postgres: start replication on slot %q: %w", cfg.Slot, err)
	}
	in.ready.Store(true)
	r.stopping = stopping
	tailing.Store(true)
	in.log.Info("ingest: tailing", zap.String("slot", cfg.Slot), zap.String("publication", cfg.Publication), zap.Int("tables", len(keys)))
	r.rels, r.pub, r.replay = newRelations(cfg.Prefix, only, in.maxEvent, types, conn), pub, rp
	if r.reg != nil {
		r.rels.claim = func(ctx context.Context, subjects []string) error {
			if err := r.reg.add(ctx, subjects); err != nil {
				if errors.Is(err, errWriterConflict) {
					return errFatal{err}
				}
				return fmt.Errorf("broker: register this ingest's subjects: %w", err)
			}
			return nil
		}
	}
	if docs != nil {
		r.rels.renamed = docs.renamed
	}
	// Tables published now that the slot's bootstrap did not cover (added
	// to --tables or to the publication since): their rows, late.
	for _, q := range slices.Sorted(maps.Keys(keys)) {
		if err := r.requestLate(ctx, oids[q], q); err != nil {
			return err
		}
	}
	defer r.close()
	return r.run(ctx)
}
