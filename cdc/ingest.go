package cdc

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync/atomic"
	"time"

	"github.com/fanwire/fanwire/broker"
	"github.com/fanwire/fanwire/metrics"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
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
	ctx, cancel := context.WithCancelCause(parent)
	defer cancel(nil)
	defer func() {
		if parent.Err() == nil && ctx.Err() != nil {
			err = context.Cause(ctx) // the lock was lost, or a publish failed
		}
	}()
	cfg := &in.cfg
	ccfg, err := pgx.ParseConfig(cfg.DSN)
	if err != nil {
		return errFatal{fmt.Errorf("postgres: %w", err)}
	}
	withSessionParams(ccfg.RuntimeParams)
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
	// values: projections, the bootstrap, the tail.
	types := newTypeCache()
	var docs *docEngine
	pubTables := cfg.Tables
	if len(cfg.Projections) > 0 {
		if docs, err = in.newDocEngine(ctx, conn, types); err != nil {
			return err
		}
		defer docs.close()
		pubTables = slices.Concat(cfg.Tables, projectionTables(cfg.Projections))
	}
	keys, err := ensurePublication(ctx, conn, cfg.Publication, pubTables)
	if err != nil {
		return errFatal{err}
	}
	if docs != nil {
		keys = tableEventKeys(keys, cfg.Tables)
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

	rcfg, err := pgconn.ParseConfig(cfg.DSN)
	if err != nil {
		return errFatal{fmt.Errorf("postgres: %w", err)}
	}
	withSessionParams(rcfg.RuntimeParams)
	rcfg.RuntimeParams["replication"] = "database"
	// pgoutput writes values with the walsender's output settings.
	maps.Copy(rcfg.RuntimeParams, outputParams)
	rconn, err := pgconn.ConnectConfig(ctx, rcfg)
	if err != nil {
		return fmt.Errorf("postgres: replication connection: %w", err)
	}
	defer rconn.Close(context.WithoutCancel(ctx))

	// A slot that exists is read again from its confirmed LSN: the
	// broker's high-water mark says what of that it has. (A new slot is
	// bootstrapped, and its changes are all after any mark.)
	hw, rp, err := in.learnHighWater(ctx, conn, st.exists)
	if err != nil {
		return err
	}
	pub := newPublisher(in, lease, hw, cancel)
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
		if err := in.bootstrap(ctx, conn, keys, docs, types, res.SnapshotName, start, pub); err != nil {
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
	in.log.Info("ingest: tailing", zap.String("slot", cfg.Slot), zap.String("publication", cfg.Publication), zap.Int("tables", len(keys)))
	r := &reader{in: in, conn: rconn, rels: newRelations(cfg.Prefix, keys, in.maxEvent, types, conn), pub: pub, streamed: make(map[uint32]*txn), hbConn: conn, docs: docs, replay: rp}
	defer r.close()
	return r.run(ctx)
}

// reader owns the replication connection.
type reader struct {
	in   *Ingest
	conn *pgconn.PgConn
	rels *relations
	docs *docEngine // projections; nil without
	// Documents waiting for the flush window (coalesced across the
	// transactions of one window), and the last transaction merged.
	pend         *docChanges
	pendTx       *txn
	pendStart    pglogrepl.LSN // the commit LSN of the window's first transaction
	pendDeadline time.Time
	// replay, while the transactions read again are ones whose events the
	// broker may have already (highwater.go); nil otherwise.
	replay    *replay
	pub       *publisher
	hbConn    *pgx.Conn // for heartbeats; owned by the reader once tailing
	cur       *txn      // the transaction being received (not streamed)
	inStream  bool
	streamXid uint32
	streamed  map[uint32]*txn // streamed transactions' changes so far, by top-level xid
	held      int64           // what the changes of cur and streamed take in memory (changeSize); MaxTxnMemory bounds it
	enc       eventEncoder    // builds the table events of the transaction being committed

	walEnd     pglogrepl.LSN // the server's WAL end, last reported
	received   pglogrepl.LSN // end of the last commit handed to the publisher
	lastData   time.Time     // when the last change or commit arrived
	nextStatus time.Time     // when the next standby status update is due
	committing bool          // a commit is being handed over: its end is not received yet
}

func (r *reader) run(ctx context.Context) error {
	cfg := &r.in.cfg
	r.nextStatus = time.Now().Add(cfg.StatusInterval)
	r.lastData = time.Now()
	// The reader sets the connection's read deadline itself and receives
	// with context.Background(), for which pgconn watches no context: with
	// any other, every ReceiveMessage registers a context.AfterFunc and
	// removes it again (a tenth of the ingest's CPU on a busy tail). The
	// run's context still ends a receive: one AfterFunc for the whole run
	// moves the deadline to the past, and a deadline set after it fired is
	// caught by the check of ctx that follows every change of deadline.
	nc := r.conn.Conn()
	stopWake := context.AfterFunc(ctx, func() { _ = nc.SetReadDeadline(time.Unix(1, 0)) })
	defer func() {
		if stopWake() {
			_ = nc.SetReadDeadline(time.Time{})
		}
	}()
	var readDeadline time.Time // as last set on nc
	for {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if time.Now().After(r.nextStatus) {
			if err := r.sendStatus(ctx, false); err != nil {
				return err
			}
			r.nextStatus = time.Now().Add(cfg.StatusInterval)
			if err := r.heartbeat(ctx); err != nil {
				return err
			}
		}
		if r.pend != nil && r.replay == nil && !time.Now().Before(r.pendDeadline) {
			if err := r.flushDocs(ctx); err != nil {
				return err
			}
		}
		deadline := r.nextStatus
		if r.pend != nil && r.replay == nil && r.pendDeadline.Before(deadline) {
			deadline = r.pendDeadline
		}
		if !deadline.Equal(readDeadline) {
			if err := nc.SetReadDeadline(deadline); err != nil {
				return fmt.Errorf("postgres: receive: %w", err)
			}
			readDeadline = deadline
			if ctx.Err() != nil { // its AfterFunc may have run before
				return ctx.Err()
			}
		}
		raw, err := r.conn.ReceiveMessage(context.Background())
		if err != nil {
			if pgconn.Timeout(err) {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				continue
			}
			return fmt.Errorf("postgres: receive: %w", err)
		}
		switch msg := raw.(type) {
		case *pgproto3.ErrorResponse:
			return fmt.Errorf("postgres: replication: %s (%s)", msg.Message, msg.Code)
		case *pgproto3.CopyData:
			if len(msg.Data) == 0 {
				continue
			}
			switch msg.Data[0] {
			case pglogrepl.PrimaryKeepaliveMessageByteID:
				ka, err := pglogrepl.ParsePrimaryKeepaliveMessage(msg.Data[1:])
				if err != nil {
					return fmt.Errorf("postgres: keepalive: %w", err)
				}
				r.seeWALEnd(ka.ServerWALEnd)
				if ka.ReplyRequested { // wal_sender_timeout: answer at once
					if err := r.sendStatus(ctx, false); err != nil {
						return err
					}
					r.nextStatus = time.Now().Add(cfg.StatusInterval)
				}
			case pglogrepl.XLogDataByteID:
				xld, err := pglogrepl.ParseXLogData(msg.Data[1:])
				if err != nil {
					return fmt.Errorf("postgres: xlogdata: %w", err)
				}
				r.seeWALEnd(xld.ServerWALEnd)
				// pgconn's Receive returns a message valid only until the next
				// call (its buffers go back to a pool), and a change's values
				// point into it (parseChange): a change is kept until its
				// transaction commits, so it needs bytes of its own.
				if err := r.handle(ctx, bytes.Clone(xld.WALData)); err != nil {
					return err
				}
			}
		}
	}
}

// seeWALEnd records the server's WAL end, as a keepalive or a WAL message
// reports it (for confirming an idle slot, and for the lag metric).
func (r *reader) seeWALEnd(lsn pglogrepl.LSN) {
	r.walEnd = max(r.walEnd, lsn)
	r.in.walEnd.Store(uint64(r.walEnd))
}

// sendStatus confirms what the broker has acknowledged. When nothing is in
// flight (no transaction open or unpublished), it confirms the server's WAL
// end, so that an idle or filtered-out database does not hold WAL.
func (r *reader) sendStatus(ctx context.Context, reply bool) error {
	r.in.wal.Publish()
	acked := pglogrepl.LSN(r.pub.acked.Load())
	// The memory state is stored up to what is acknowledged before that
	// is confirmed: PostgreSQL never resends less than the state lacks.
	if err := r.docs.persist(acked); err != nil {
		return err
	}
	lsn := acked
	if r.cur == nil && len(r.streamed) == 0 && r.pend == nil && !r.committing && acked >= r.received && r.walEnd > lsn {
		lsn = r.walEnd
		if err := r.docs.advance(lsn); err != nil {
			return err
		}
	}
	if lsn > pglogrepl.LSN(r.in.confirmed.Load()) {
		r.in.confirmed.Store(uint64(lsn))
	}
	c := pglogrepl.LSN(r.in.confirmed.Load())
	if c == 0 {
		return nil // nothing to say yet
	}
	if err := pglogrepl.SendStandbyStatusUpdate(ctx, r.conn, pglogrepl.StandbyStatusUpdate{
		WALWritePosition: c, WALFlushPosition: c, WALApplyPosition: c, ReplyRequested: reply,
	}); err != nil {
		return fmt.Errorf("postgres: standby status: %w", err)
	}
	return nil
}

// heartbeat writes a non-transactional logical message when the database
// has been idle for Config.Heartbeat: the slot then sees WAL it can
// confirm, even when no published table changes.
func (r *reader) heartbeat(ctx context.Context) error {
	hb := r.in.cfg.Heartbeat
	if hb < 0 || time.Since(r.lastData) < hb {
		return nil
	}
	r.lastData = time.Now()
	if _, err := r.hbConn.Exec(ctx, "SELECT pg_logical_emit_message(false, 'fanwire-heartbeat', '')"); err != nil {
		return fmt.Errorf("postgres: heartbeat: %w", err)
	}
	return nil
}

// handle decodes one pgoutput message.
func (r *reader) handle(ctx context.Context, data []byte) error {
	if len(data) == 0 {
		return errors.New("postgres: empty pgoutput message")
	}
	kind := metrics.Kind(data[0])
	switch data[0] {
	case 'I', 'U', 'D': // row changes, decoded in place (parseChange)
		c, xid, err := parseChange(data, r.inStream)
		if err != nil {
			r.in.wal.Observe(kind, metrics.RouteSkip)
			return fmt.Errorf("postgres: decode pgoutput message %q: %w", data[0], err)
		}
		return r.add(xid, c)
	}
	m, err := decode(data, r.inStream)
	if err != nil {
		r.in.wal.Observe(kind, metrics.RouteSkip)
		return fmt.Errorf("postgres: decode pgoutput message %q: %w", data[0], err)
	}
	// Row changes are counted when their transaction commits (publish or
	// skip); everything else only updates state.
	switch m.(type) {
	case *pglogrepl.InsertMessageV2, *pglogrepl.UpdateMessageV2, *pglogrepl.DeleteMessageV2, *pglogrepl.TruncateMessageV2:
	default:
		r.in.wal.Observe(kind, metrics.RouteState)
	}
	switch m := m.(type) {
	case *pglogrepl.RelationMessageV2:
		return r.rels.define(ctx, &m.RelationMessage)
	case *pglogrepl.BeginMessage:
		if r.cur != nil { // a begin without a commit: let it go, with its spill file
			r.release(r.cur)
			r.done(r.cur)
		}
		r.cur = &txn{xid: m.Xid, commitLSN: m.FinalLSN, commitTime: m.CommitTime}
	case *pglogrepl.CommitMessage:
		t := r.cur
		r.cur = nil
		if t == nil {
			return errors.New("postgres: commit without begin")
		}
		t.commitLSN, t.endLSN, t.commitTime = m.CommitLSN, m.TransactionEndLSN, m.CommitTime
		return r.commit(ctx, t)
	case *pglogrepl.InsertMessageV2:
		return r.add(m.Xid, change{kind: 'I', rel: m.RelationID, newRow: m.Tuple})
	case *pglogrepl.UpdateMessageV2:
		return r.add(m.Xid, change{kind: 'U', rel: m.RelationID, newRow: m.NewTuple, oldRow: m.OldTuple, oldKind: m.OldTupleType})
	case *pglogrepl.DeleteMessageV2:
		return r.add(m.Xid, change{kind: 'D', rel: m.RelationID, oldRow: m.OldTuple, oldKind: m.OldTupleType})
	case *pglogrepl.TruncateMessageV2:
		return r.add(m.Xid, change{kind: 'T', truncs: m.RelationIDs})
	case *pglogrepl.StreamStartMessageV2:
		r.inStream, r.streamXid = true, m.Xid
	case *pglogrepl.StreamStopMessageV2:
		r.inStream = false
	case *pglogrepl.StreamCommitMessageV2:
		t := r.streamed[m.Xid]
		delete(r.streamed, m.Xid)
		if t == nil { // streamed without a change of a published table
			t = &txn{xid: m.Xid}
		}
		t.commitLSN, t.endLSN, t.commitTime = m.CommitLSN, m.TransactionEndLSN, m.CommitTime
		return r.commit(ctx, t)
	case *pglogrepl.StreamAbortMessageV2:
		t := r.streamed[m.Xid]
		if t == nil {
			return nil
		}
		if m.SubXid == m.Xid || m.SubXid == 0 {
			delete(r.streamed, m.Xid)
			r.release(t)
			r.done(t)
			return nil
		}
		// A rolled-back subtransaction: drop its changes only.
		r.abortSub(t, m.SubXid)
	}
	// Type, origin and logical decoding messages (our heartbeats) only
	// matter for the WAL position, which keepalives report.
	return nil
}

// commit turns a committed transaction's changes into events and queues
// them for the publisher, with the transaction's end LSN to confirm once
// they are acknowledged.
func (r *reader) commit(ctx context.Context, t *txn) error {
	r.lastData = time.Now()
	r.release(t) // its changes go as they are used
	defer r.done(t)
	r.committing = true
	defer func() { r.committing = false }()
	var evs []broker.Outgoing
	done := 0 // events of the transaction already handed to the publisher
	var window pglogrepl.LSN
	if r.pend != nil {
		window = r.pendStart
	}
	// The transaction's table events are built by the reader's encoder
	// (ids as tableEventID makes them).
	r.enc.begin(t.commitLSN, t.commitTime, window)
	t.enc = &r.enc
	defer func() { t.enc = nil }()
	id := func(i int) string { return r.enc.tableID(done + i) }
	flush := r.flusher(ctx, &done)
	var dc *docChanges // the documents the transaction affects
	if r.docs != nil {
		dc = newDocChanges()
	}
	// A transaction the memory state already holds (it was persisted once
	// its events were acknowledged, and PostgreSQL resends from the LSN
	// confirmed before) is done: nothing of it is applied or published.
	if r.docs != nil && r.docs.mem != nil && t.endLSN <= r.docs.mem.lsn {
		if r.replay != nil && t.commitLSN >= r.replay.until {
			// Acknowledged through the high-water mark: nothing to replay.
			r.replay, r.pend, r.pendTx = nil, nil, nil
		}
		r.received = t.endLSN
		return r.pub.add(ctx, nil, t.endLSN, t.commitTime)
	}
	// A big transaction goes to the publisher in MaxBatch slices as its
	// events are built (only the last slice confirms its end), and its
	// decoded rows are let go as they are used: it is held once, not as
	// rows, events and one batch at the same time. A spilled one is read
	// back a change at a time.
	left := t.changes.len() // held changes not yet applied (a spilled transaction's others are not counted)
	each := func(c *change) error {
		var err error
		if evs, err = flush(evs); err != nil {
			return err
		}
		if tb := r.rels.byID[c.rel]; evs == nil && (c.kind == 'T' || tb != nil && tb.published()) {
			// Most changes make one event: room for the rest, up to a
			// batch, instead of growing the slice to it.
			n := r.in.cfg.MaxBatch
			if t.spill == nil {
				n = min(n, left)
			}
			evs = make([]broker.Outgoing, 0, n)
		}
		evs, err = r.apply(ctx, t, dc, c, evs, id)
		return err
	}
	if t.spill != nil {
		if err := t.spill.replay(each); err != nil {
			return err
		}
	}
	if err := t.changes.consume(func(c *change) error {
		err := each(c)
		left--
		return err
	}); err != nil {
		return err
	}
	if dc != nil && !dc.empty() {
		// The documents, recomposed once each however many of their rows
		// the transaction changed — or the transactions of one flush window
		// changed — after its table events.
		r.docs.commitMem(dc, t.endLSN)
		switch {
		case r.replay.drops(t.commitLSN): // published in a window the broker has whole
		case r.pend == nil:
			r.pend, r.pendStart, r.pendDeadline = dc, t.commitLSN, time.Now().Add(r.in.cfg.FlushWindow)
		default:
			r.pend.merge(dc)
		}
	}
	flushNow := r.in.cfg.FlushWindow <= 0 || r.pend != nil && (!time.Now().Before(r.pendDeadline) || r.pend.size() >= r.in.cfg.MaxBatch)
	if r.replay != nil && t.commitLSN <= r.replay.until {
		// The window that was open at the high-water mark is made again
		// exactly: it ends with the mark's transaction.
		flushNow = t.commitLSN == r.replay.until
	}
	if r.replay != nil && t.commitLSN >= r.replay.until {
		r.replay = nil
	}
	if r.pend != nil {
		r.pendTx = t
		if flushNow {
			var err error
			if evs, err = r.docs.events(ctx, evs, r.pend, t, r.docID(t), flush); err != nil {
				return err
			}
			r.pend, r.pendTx = nil, nil
		} else {
			// Documents wait for the window: the transaction's table events
			// go now, but its end is confirmed with the documents.
			r.received = t.endLSN
			return r.pub.add(ctx, evs, 0, t.commitTime)
		}
	}
	r.received = t.endLSN
	r.in.oldest.CompareAndSwap(0, t.commitTime.UnixNano())
	r.in.wal.Publish() // counters readable by scrapes, once per commit
	return r.pub.add(ctx, evs, t.endLSN, t.commitTime)
}

// apply adds the events of one change of committed transaction t to evs,
// and records the documents it affects in dc (with projections).
func (r *reader) apply(ctx context.Context, t *txn, dc *docChanges, c *change, evs []broker.Outgoing, id func(int) string) ([]broker.Outgoing, error) {
	if c.kind == 'T' {
		route := metrics.RouteSkip
		for _, rel := range c.truncs {
			tb := r.rels.byID[rel]
			if tb != nil && r.docs != nil {
				if err := r.docs.observeTruncate(ctx, dc, tb); err != nil {
					return evs, err
				}
			}
			if tb == nil || !tb.published() {
				continue
			}
			route = metrics.RoutePublish
			evs = append(evs, truncateEvent(tb, id(len(evs)), t.commitLSN, t.commitTime))
		}
		r.in.wal.Observe('T', route)
		return evs, nil
	}
	tb := r.rels.byID[c.rel]
	if tb == nil {
		return evs, fmt.Errorf("postgres: change for relation %d before its Relation message", c.rel)
	}
	if r.docs != nil {
		if err := r.docs.observe(dc, tb, c); err != nil {
			return evs, err
		}
	}
	if !tb.published() {
		r.in.wal.Observe(metrics.Kind(c.kind), metrics.RouteSkip)
		return evs, nil
	}
	r.in.wal.Observe(metrics.Kind(c.kind), metrics.RoutePublish)
	evs, err := tb.proj.project(evs, t, tb, c, id)
	if bad, ok := asBadRow(err); ok {
		r.in.reportBad(bad) // its error event stands in evs
		err = nil
	}
	return evs, err
}

// flusher returns the function that hands a transaction's events to the
// publisher once they fill a MaxBatch slice, as they are built (a big
// transaction is not held whole; only its last slice confirms its end). It
// returns the events still to hand over; *handed counts those handed, whose
// ids are taken.
func (r *reader) flusher(ctx context.Context, handed *int) func([]broker.Outgoing) ([]broker.Outgoing, error) {
	return func(evs []broker.Outgoing) ([]broker.Outgoing, error) {
		if len(evs) < r.in.cfg.MaxBatch {
			return evs, nil
		}
		if err := r.pub.add(ctx, evs, 0, time.Time{}); err != nil {
			return evs, err
		}
		*handed += len(evs)
		return nil, r.keepAlive(ctx)
	}
}

// docID gives the ids of the documents of the window that ends with t.
func (r *reader) docID(t *txn) func(p *docProjection, key []byte) string {
	return docEventIDs(t.commitLSN, r.pendStart)
}

// keepAlive sends the standby status update when it is due, while a big
// transaction is handed over: the publisher's bound holds the reader
// there for as long as the broker takes (a 2,000,000-row transaction:
// minutes), and PostgreSQL ends a replication connection that has not
// answered for wal_sender_timeout (60s), which would start the
// transaction over, forever. Replies are what the walsender waits for; it
// is not read meanwhile, and TCP holds back what it sends.
func (r *reader) keepAlive(ctx context.Context) error {
	if time.Now().Before(r.nextStatus) {
		return nil
	}
	r.nextStatus = time.Now().Add(r.in.cfg.StatusInterval)
	return r.sendStatus(ctx, false)
}

// flushDocs publishes the documents waiting for the flush window, with the
// end of the last transaction they cover, which is then confirmable.
func (r *reader) flushDocs(ctx context.Context) error {
	t := r.pendTx
	var handed int // documents' ids do not count events
	evs, err := r.docs.events(ctx, nil, r.pend, t, r.docID(t), r.flusher(ctx, &handed))
	if err != nil {
		return err
	}
	r.pend, r.pendTx = nil, nil
	return r.pub.add(ctx, evs, t.endLSN, t.commitTime)
}

// parseChange parses an Insert, Update or Delete message (data[0] is 'I',
// 'U' or 'D') as pglogrepl.ParseV2 does, into the change it holds and
// the (sub)transaction that made it (inStream: a streamed transaction's;
// 0 otherwise). pglogrepl copies every column's value out of the message
// and allocates each column, the tuple and the message on its own; the
// reader already holds a copy of the message, so the values point into
// data (capped: nothing appends to them), and a tuple's columns take two
// allocations, the change's tuples one. A malformed message is an error.
func parseChange(data []byte, inStream bool) (c change, xid uint32, err error) {
	d := changeDecoder{b: data[1:]}
	// pglogrepl's least lengths, kept: an insert of no columns is refused.
	least := 4 // 'D'
	switch data[0] {
	case 'I':
		least = 8
	case 'U':
		least = 6
	}
	if inStream {
		least += 4
	}
	if len(d.b) < least {
		return change{}, 0, fmt.Errorf("%c message must have %d bytes, got %d bytes", data[0], least, len(d.b))
	}
	if inStream {
		xid = d.uint32()
	}
	c.kind, c.rel = data[0], d.uint32()
	rows := new([2]pglogrepl.TupleData)
	switch tt := d.byte(); {
	case c.kind == 'I':
		if tt != 'N' && !d.bad {
			return change{}, 0, fmt.Errorf("InsertMessage: invalid TupleType: expected N, got %q", tt)
		}
		c.newRow = d.tuple(&rows[0])
	case c.kind == 'U':
		switch tt {
		case 'K', 'O':
			c.oldKind, c.oldRow = tt, d.tuple(&rows[1])
			d.byte() // the new tuple's 'N'
			fallthrough
		case 'N':
			c.newRow = d.tuple(&rows[0])
		default:
			if !d.bad {
				return change{}, 0, fmt.Errorf("UpdateMessage: invalid Tuple: expected K/O/N, got %q", tt)
			}
		}
	default: // 'D'
		if tt != 'K' && tt != 'O' && !d.bad {
			return change{}, 0, fmt.Errorf("DeleteMessage: invalid OldTupleType: expected K/O, got %q", tt)
		}
		c.oldKind, c.oldRow = tt, d.tuple(&rows[1])
	}
	if d.bad {
		return change{}, 0, fmt.Errorf("malformed message (%d bytes, truncated)", len(data))
	}
	return c, xid, nil
}

// changeDecoder reads a change message's fields; past its end, it reads
// zeros and marks itself bad.
type changeDecoder struct {
	b   []byte
	bad bool
}

func (d *changeDecoder) byte() byte {
	if len(d.b) < 1 {
		d.bad = true
		return 0
	}
	v := d.b[0]
	d.b = d.b[1:]
	return v
}

func (d *changeDecoder) uint16() uint16 {
	if len(d.b) < 2 {
		d.bad = true
		return 0
	}
	v := binary.BigEndian.Uint16(d.b)
	d.b = d.b[2:]
	return v
}

func (d *changeDecoder) uint32() uint32 {
	if len(d.b) < 4 {
		d.bad = true
		return 0
	}
	v := binary.BigEndian.Uint32(d.b)
	d.b = d.b[4:]
	return v
}

// tuple reads a TupleData into t, as pglogrepl's TupleData.Decode does: a
// text or binary column has its length and value; any other (null,
// unchanged TOAST, an unknown kind) its kind only.
func (d *changeDecoder) tuple(t *pglogrepl.TupleData) *pglogrepl.TupleData {
	n := int(d.uint16())
	if d.bad {
		return nil
	}
	t.ColumnNum = uint16(n)
	if n == 0 {
		return t
	}
	if n > len(d.b) { // a column takes a byte at least
		d.bad = true
		return nil
	}
	cols := make([]pglogrepl.TupleDataColumn, n)
	t.Columns = make([]*pglogrepl.TupleDataColumn, n)
	for i := range cols {
		col := &cols[i]
		col.DataType = d.byte()
		if col.DataType == pglogrepl.TupleDataTypeText || col.DataType == pglogrepl.TupleDataTypeBinary {
			l := d.uint32()
			if d.bad || uint64(l) > uint64(len(d.b)) {
				d.bad = true
				return nil
			}
			col.Length, col.Data = l, d.b[:l:l]
			d.b = d.b[l:]
		}
		t.Columns[i] = col
	}
	return t
}

// decode parses one pgoutput message. pglogrepl indexes into messages
// without checking their length (a truncated tuple panics), so a panic
// while parsing is turned into an error: a malformed message ends the
// connection with a clear error, not the process.
func decode(data []byte, inStream bool) (m pglogrepl.Message, err error) {
	defer func() {
		if p := recover(); p != nil {
			m, err = nil, fmt.Errorf("malformed message (%v)", p)
		}
	}()
	return pglogrepl.ParseV2(data, inStream)
}
