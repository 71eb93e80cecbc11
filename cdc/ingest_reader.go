package cdc

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/fanwire/fanwire/broker"
	"github.com/fanwire/fanwire/metrics"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"go.uber.org/zap"
)

// The tail: once Run has set up the slot, the snapshot and the leadership,
// the reader receives the replication stream, assembles each transaction
// (streamed ones included), hands its events to the publisher in commit
// order and confirms to PostgreSQL what the broker has acknowledged.

// reader owns the replication connection.
type reader struct {
	in   *Ingest
	conn *pgconn.PgConn
	rels *relations
	reg  *registration // the ingest's subjects in the broker's registry; nil on a broker without one
	docs *docEngine    // projections; nil without
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
	held      int64           // what the changes of cur and streamed take in memory (heldSize); MaxTxnMemory bounds it
	enc       eventEncoder    // builds the table events of the transaction being committed
	recv      changeDecoder   // checks each change as it is received
	pacer     *pacer          // the replication connection's, for pace (ingest_pace.go)
	dec       changeDecoder   // decodes the held changes of the transaction being committed

	walEnd     pglogrepl.LSN // the server's WAL end, last reported
	received   pglogrepl.LSN // end of the last commit handed to the publisher
	lastData   time.Time     // when the last change or commit arrived
	nextStatus time.Time     // when the next standby status update is due
	committing bool          // a commit is being handed over: its end is not received yet
	// booted are the tables bootstrapped, by OID, with their snapshots'
	// LSN; late, those being bootstrapped late, which lateRun runs
	// (lateboot.go). booted nil: no late bootstraps (tests).
	booted  map[uint32]pglogrepl.LSN
	late    map[uint32]*lateBoot
	lateRun func(*lateBoot)
	// stopping ends when the ingest is asked to stop: the reader then
	// stops cleanly (stop) while the run's context lives on for it.
	stopping context.Context
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
	stopping := r.stopping
	if stopping == nil {
		stopping = context.Background()
	}
	stopWake2 := context.AfterFunc(stopping, func() { _ = nc.SetReadDeadline(time.Unix(1, 0)) })
	defer func() {
		a, b := stopWake(), stopWake2()
		if a && b {
			_ = nc.SetReadDeadline(time.Time{})
		}
	}()
	var readDeadline time.Time // as last set on nc
	r.pacer = newPacer(nc)
	for {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if stopping.Err() != nil {
			return r.stop(ctx)
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
			if ctx.Err() != nil || stopping.Err() != nil { // their AfterFunc may have run before
				continue
			}
		}
		r.pace()
		raw, err := r.conn.ReceiveMessage(context.Background())
		if err != nil {
			if pgconn.Timeout(err) {
				readDeadline = time.Time{} // an AfterFunc may have moved it
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
				// call (its buffers go back to a pool): handle copies what it
				// keeps.
				if err := r.handle(ctx, xld.WALData); err != nil {
					return err
				}
			}
		}
	}
}

// stop ends the reader cleanly, on SIGTERM: the documents waiting for
// their flush window go now (not while a window is being made again up to
// the high-water mark: they keep waiting, for the next start), the broker
// acknowledges everything handed over, and that is confirmed to
// PostgreSQL; a transaction being received is read again at the next
// start. The next start then has nothing to skip.
func (r *reader) stop(ctx context.Context) error {
	if r.pend != nil && r.replay == nil {
		if err := r.flushDocs(ctx); err != nil {
			return err
		}
	}
	if err := r.pub.sync(ctx); err != nil {
		return err
	}
	if err := r.sendStatus(ctx, false); err != nil {
		return err
	}
	r.in.log.Info("ingest: stopped: every event handed to the broker is acknowledged, and confirmed to PostgreSQL", zap.Stringer("confirmed_lsn", r.in.Confirmed()))
	return context.Canceled
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

// handle decodes one pgoutput message. data is valid only during the
// call (the receive buffer): a change held until its commit is copied.
func (r *reader) handle(ctx context.Context, data []byte) error {
	if len(data) == 0 {
		return errors.New("postgres: empty pgoutput message")
	}
	kind := metrics.Kind(data[0])
	switch data[0] {
	case 'I', 'U', 'D': // row changes: checked now, held as they came (hold.go)
		rel, xid, err := r.recv.check(data, r.inStream)
		if err != nil {
			r.in.wal.Observe(kind, metrics.RouteSkip)
			return fmt.Errorf("postgres: decode pgoutput message %q: %w", data[0], err)
		}
		return r.add(heldChange{msg: data, tbl: r.rels.byID[rel], xid: xid, stream: r.inStream})
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
		if err := r.rels.define(ctx, &m.RelationMessage); err != nil {
			return err
		}
		if t := r.rels.byID[m.RelationID]; t.published() {
			return r.requestLate(ctx, m.RelationID, t.nameKey)
		}
	case *pglogrepl.BeginMessage:
		if r.cur != nil { // a begin without a commit: let it go, with its spill file
			r.release(r.cur)
			r.done(r.cur)
		}
		r.cur = &txn{xid: m.Xid, commitLSN: m.FinalLSN, commitTime: m.CommitTime}
		r.lastData = time.Now() // (not per change: a clock read each was 4% of the tail's CPU)
	case *pglogrepl.CommitMessage:
		t := r.cur
		r.cur = nil
		if t == nil {
			return errors.New("postgres: commit without begin")
		}
		t.commitLSN, t.endLSN, t.commitTime = m.CommitLSN, m.TransactionEndLSN, m.CommitTime
		return r.commit(ctx, t)
	case *pglogrepl.TruncateMessageV2:
		h := heldChange{truncs: make([]*table, len(m.RelationIDs)), xid: m.Xid}
		for i, rel := range m.RelationIDs {
			if h.truncs[i] = r.rels.byID[rel]; h.truncs[i] == nil {
				return fmt.Errorf("postgres: truncate of relation %d before its Relation message", rel)
			}
		}
		return r.add(h)
	case *pglogrepl.StreamStartMessageV2:
		r.inStream, r.streamXid = true, m.Xid
		r.lastData = time.Now()
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
	if err := r.waitLate(ctx, t.commitLSN); err != nil {
		return err
	}
	r.release(t) // its changes go as they are used
	defer r.done(t)
	r.committing = true
	defer func() { r.committing = false }()
	var evs []broker.Outgoing
	var window pglogrepl.LSN
	if r.pend != nil {
		window = r.pendStart
	}
	// The transaction's table events are built by the reader's encoder
	// (ids as tableEventID makes them).
	r.enc.begin(t.commitLSN, t.commitTime, window)
	t.enc = &r.enc
	defer func() { t.enc = nil }()
	flush := r.flusher(ctx)
	seq := 0           // the index of the next change in the transaction (eventid.go)
	var dc *docChanges // the documents the transaction affects
	if r.docs != nil {
		dc = newDocChanges()
	}
	// A transaction the memory state already holds (it was persisted once
	// its events were acknowledged, and PostgreSQL resends from the LSN
	// confirmed before) is done: nothing of it is applied or published.
	if lsn, mem := r.docs.memLSN(); mem && t.endLSN <= lsn {
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
	each := func(h *heldChange) error {
		c, err := r.decodeHeld(h)
		if err != nil {
			return err
		}
		if evs, err = flush(evs); err != nil {
			return err
		}
		if tb := c.tbl; evs == nil && (c.kind == 'T' || tb != nil && tb.published()) {
			// Most changes make one event: room for the rest, up to a
			// batch, instead of growing the slice to it.
			n := r.in.cfg.MaxBatch
			if t.spill == nil {
				n = min(n, left)
			}
			evs = make([]broker.Outgoing, 0, n)
		}
		evs, err = r.apply(ctx, t, dc, c, evs, seq)
		seq += max(1, len(c.truncs))
		return err
	}
	if t.spill != nil {
		if err := t.spill.replay(r.rels.generation, each); err != nil {
			return err
		}
	}
	if err := t.changes.consume(func(h *heldChange) error {
		err := each(h)
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

// decodeHeld decodes held change h of the transaction being committed,
// into memory reused from change to change (r.dec): the change is valid
// until the next one's decoding.
func (r *reader) decodeHeld(h *heldChange) (*change, error) {
	if h.msg == nil {
		r.dec.c = change{kind: 'T', xid: h.xid, truncs: h.truncs}
		return &r.dec.c, nil
	}
	c, _, err := r.dec.decode(h.msg, h.stream)
	if err != nil { // checked when received: a spill file's record went bad
		return nil, fmt.Errorf("postgres: decode a held %q message: %w", h.msg[0], err)
	}
	c.tbl, c.xid = h.tbl, h.xid
	return c, nil
}

// apply adds the events of one change of committed transaction t to evs,
// and records the documents it affects in dc (with projections). seq is
// the change's index in the transaction (a truncate takes one per table).
func (r *reader) apply(ctx context.Context, t *txn, dc *docChanges, c *change, evs []broker.Outgoing, seq int) ([]broker.Outgoing, error) {
	if c.kind == 'T' {
		route := metrics.RouteSkip
		for j, tb := range c.truncs {
			if tb != nil && r.docs != nil {
				if err := r.docs.observeTruncate(ctx, dc, tb); err != nil {
					return evs, err
				}
			}
			if tb == nil || !tb.published() || r.dropsChange(tb.oid, t.commitLSN) {
				continue
			}
			route = metrics.RoutePublish
			evs = append(evs, truncateEvent(tb, r.enc.tableID(seq+j), t.commitLSN, t.commitTime))
		}
		r.in.wal.Observe('T', route)
		return evs, nil
	}
	tb := c.tbl
	if tb == nil {
		return evs, fmt.Errorf("postgres: change for relation %d before its Relation message", c.rel)
	}
	if r.docs != nil {
		if err := r.docs.observe(dc, tb, c); err != nil {
			return evs, err
		}
	}
	if !tb.published() || r.dropsChange(tb.oid, t.commitLSN) {
		r.in.wal.Observe(metrics.Kind(c.kind), metrics.RouteSkip)
		return evs, nil
	}
	r.in.wal.Observe(metrics.Kind(c.kind), metrics.RoutePublish)
	evs, err := tb.proj.project(evs, t, tb, c, r.enc.tableID(seq))
	if bad, ok := asBadRow(err); ok {
		r.in.reportBad(bad) // its error event stands in evs
		err = nil
	}
	return evs, err
}

// flusher returns the function that hands a transaction's events to the
// publisher once they fill a MaxBatch slice, as they are built (a big
// transaction is not held whole; only its last slice confirms its end). It
// returns the events still to hand over.
func (r *reader) flusher(ctx context.Context) func([]broker.Outgoing) ([]broker.Outgoing, error) {
	return func(evs []broker.Outgoing) ([]broker.Outgoing, error) {
		if len(evs) < r.in.cfg.MaxBatch {
			return evs, nil
		}
		if err := r.pub.add(ctx, evs, 0, time.Time{}); err != nil {
			return evs, err
		}
		return nil, r.keepAlive(ctx)
	}
}

// docID gives the ids of the documents of the window that ends with t.
func (r *reader) docID(t *txn) func(p *docProjection, key []byte) string {
	return docEventIDs(r.in.writer, t.commitLSN, r.pendStart)
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
	evs, err := r.docs.events(ctx, nil, r.pend, t, r.docID(t), r.flusher(ctx))
	if err != nil {
		return err
	}
	r.pend, r.pendTx = nil, nil
	return r.pub.add(ctx, evs, t.endLSN, t.commitTime)
}
