package cdc

import (
	"context"
	"fmt"
	"time"

	"github.com/fanwire/fanwire/broker"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"
)

// Exactly once without a duplicate window. After a crash PostgreSQL sends
// again every transaction after the LSN the ingest confirmed, and the
// confirmed LSN trails what the broker stores: the broker's duplicate
// window drops the repeats, but only for as long as it remembers ids (2
// minutes by default) — a crash loop or an outage longer than that would
// publish them again. So at the start of every run (after a crash, a
// reconnect to PostgreSQL or to the broker) the ingest asks the broker for
// the last event it stores of this ingest's (its high-water mark: events
// of other writers in the stream, or on the same prefix, never count): the
// ingest publishes in order, so every event of its at or before the mark
// in the publish order (eventid.go) is stored, every one after it is not.
//
// Events are skipped by the publisher; the reader makes again exactly the
// window of documents that was open at the mark: documents of transactions
// before the window are dropped (a window the broker has whole), those of
// the window's transactions are gathered into one window that ends with
// the mark's transaction, whatever time or size would say, so that their
// ids (and their order) are the ones published before.

// replay is what the reader does while transactions up to the high-water
// mark's come again. A nil *replay is no replay.
type replay struct {
	from  pglogrepl.LSN // documents of transactions committed before it are dropped
	until pglogrepl.LSN // the mark's transaction: the window ends with it
}

// drops reports whether the documents of the transaction committed at lsn
// are in a window the broker has whole.
func (r *replay) drops(lsn pglogrepl.LSN) bool { return r != nil && lsn < r.from }

// highWater is the last event of this ingest's that the broker stores, and
// how the publisher skips what is at or before it.
type highWater struct {
	writer  string
	id      string
	pos     eventPos
	skipped int // events skipped so far
}

// learnHighWater asks the broker for the ingest's last stored event among
// its subjects (those it publishes and published on). It returns the id
// ("" for none) and, when the slot is read again (use), the mark and the
// replay; a mark that cannot be this server's (an LSN past the server's
// WAL end: the broker holds events of another cluster, as after a restore
// into a new one), or none, leaves the duplicate window as the only guard.
// stored says the broker has stored events of this ingest before: a mark
// it no longer finds was lost (a purge, max_age, max_msgs, an evicted
// Redis key), which is logged as an error.
func (in *Ingest) learnHighWater(ctx context.Context, conn *pgx.Conn, use bool, subjects []string, stored bool) (string, *highWater, *replay, error) {
	b, ok := in.cfg.Broker.(broker.HighWater)
	if !ok {
		return "", nil, nil, nil
	}
	start := time.Now()
	id, err := b.LastID(ctx, in.writer, subjects)
	if err != nil {
		return "", nil, nil, fmt.Errorf("broker: the ingest's last stored event: %w", err)
	}
	if !use {
		return id, nil, nil, nil
	}
	if id == "" {
		if stored {
			in.marksLost.Add(1)
			in.log.Error("ingest: the broker holds no event of this ingest, though it stored some before (purged, expired, or an evicted Redis key?): no high-water mark; the changes read again are published again, and only the duplicate window drops repeats",
				zap.String("writer", in.writer), zap.Strings("subjects", subjects))
		}
		return id, nil, nil, nil
	}
	pos, ok := parseEventID(in.writer, id)
	if !ok {
		in.log.Info("ingest: the last stored event of this ingest is a bootstrap row: no high-water mark", zap.String("id", id))
		return id, nil, nil, nil
	}
	var end string
	if err := conn.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&end); err != nil {
		return "", nil, nil, fmt.Errorf("postgres: current WAL position: %w", err)
	}
	if walEnd, err := pglogrepl.ParseLSN(end); err != nil || pos.lsn > walEnd {
		in.log.Warn("ingest: the broker's last event is past this server's WAL (events of another cluster?): no high-water mark; the duplicate window alone drops repeats",
			zap.String("id", id), zap.String("wal_end", end))
		return id, nil, nil, nil
	}
	hw := &highWater{writer: in.writer, id: id, pos: pos}
	rp := &replay{from: pos.lsn, until: pos.lsn}
	if pos.window != 0 {
		rp.from = pos.window
	}
	in.log.Info("ingest: high-water mark: events up to it are in the broker already", zap.String("id", id), zap.Duration("took", time.Since(start)))
	return id, hw, rp, nil
}

// skip drops from evs the events at or before the mark. It returns the
// events to publish (evs, filtered in place), and whether the mark is
// passed (skip is then done). Bootstrap rows (a late bootstrap's, which
// can go between the changes read again) have no place in the order: they
// go, and do not end the skipping.
func (h *highWater) skip(evs []broker.Outgoing) ([]broker.Outgoing, bool) {
	out, passed := evs[:0], false
	for _, ev := range evs {
		pos, ok := parseEventID(h.writer, ev.ID)
		if ok && !passed && compareEvents(pos, h.pos) <= 0 {
			h.skipped++
			continue
		}
		passed = passed || ok
		out = append(out, ev)
	}
	return out, passed
}
