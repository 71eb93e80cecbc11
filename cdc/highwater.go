package cdc

import (
	"context"
	"fmt"
	"slices"
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
// the last event it stores on the ingest's subjects (its high-water mark):
// the ingest publishes in order, so every event at or before it in the
// publish order (eventid.go) is stored, every one after it is not.
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

// highWater is the last event the broker stores of the ingest's, and how
// the publisher skips what is at or before it.
type highWater struct {
	id      string
	pos     eventPos
	projs   []string // projection names in configuration order
	skipped int      // events skipped so far
}

// learnHighWater asks the broker for the ingest's last stored event. It is
// asked at every start, a bootstrap's too (Redis Streams records the mark
// only for subjects it has been asked about), but the mark is used only
// when the slot is read again (use). It returns nil when the broker cannot
// tell (Core NATS), stores no tail event of the ingest's, or its mark
// cannot be this server's (an LSN past the server's WAL end: the broker
// holds events of another cluster, as after a restore into a new one); the
// duplicate window is then the only guard.
func (in *Ingest) learnHighWater(ctx context.Context, conn *pgx.Conn, use bool) (*highWater, *replay, error) {
	b, ok := in.cfg.Broker.(broker.HighWater)
	if !ok {
		return nil, nil, nil
	}
	start := time.Now()
	id, err := b.LastID(ctx, in.cfg.Prefix+".>")
	if err != nil {
		return nil, nil, fmt.Errorf("broker: the ingest's last stored event: %w", err)
	}
	if !use {
		return nil, nil, nil
	}
	pos, ok := parseEventID(id)
	if !ok {
		if id != "" {
			in.log.Info("ingest: the broker's last event on the ingest's subjects is not a change's (a bootstrap row's, or another publisher's): no high-water mark", zap.String("id", id))
		}
		return nil, nil, nil
	}
	var end string
	if err := conn.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&end); err != nil {
		return nil, nil, fmt.Errorf("postgres: current WAL position: %w", err)
	}
	if walEnd, err := pglogrepl.ParseLSN(end); err != nil || pos.lsn > walEnd {
		in.log.Warn("ingest: the broker's last event is past this server's WAL (events of another cluster?): no high-water mark; the duplicate window alone drops repeats",
			zap.String("id", id), zap.String("wal_end", end))
		return nil, nil, nil
	}
	hw := &highWater{id: id, pos: pos}
	for _, p := range in.cfg.Projections {
		hw.projs = append(hw.projs, p.Name)
	}
	rp := &replay{from: pos.lsn, until: pos.lsn}
	if pos.window != 0 {
		rp.from = pos.window
	}
	in.log.Info("ingest: high-water mark: events up to it are in the broker already", zap.String("id", id), zap.Duration("took", time.Since(start)))
	return hw, rp, nil
}

// projIndex is a projection's place in the publish order.
func (h *highWater) projIndex(name string) int { return slices.Index(h.projs, name) }

// skip drops from evs the events at or before the mark. It returns the
// events to publish, and whether the mark is passed (skip is then done).
func (h *highWater) skip(evs []broker.Outgoing) ([]broker.Outgoing, bool) {
	for i, ev := range evs {
		pos, ok := parseEventID(ev.ID)
		if !ok || compareEvents(pos, h.pos, h.projIndex) > 0 {
			h.skipped += i
			return evs[i:], true
		}
	}
	h.skipped += len(evs)
	return evs[:0], false
}
