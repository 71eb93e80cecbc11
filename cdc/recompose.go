package cdc

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strings"

	"github.com/fanwire/fanwire/broker"
	"github.com/fanwire/fanwire/cdc/pgjson"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"
)

// A projection's documents are a primary row with embedded child rows
// (docs/projections.md). The docEngine serves every projection of an
// ingest: the projections are resolved against the catalog when it starts
// (recompose_catalog.go); each transaction's changes are mapped to the
// documents they affect (recompose_track.go); those documents are composed
// by their mode's composer, re-read from the database in the sql mode
// (sqlComposer, recompose_sql.go) or from the rows the memory mode keeps
// (memState, memory*.go), and published as JSON events (recompose_json.go)
// after the transaction's table events, in commit order. This file is the
// engine: its set-up, the events of a transaction, and the memory state's
// lifecycle.

// docEngine serves every projection of an ingest.
type docEngine struct {
	projs []*docProjection
	// composers are the modes the projections use, each once: the memory
	// mode's first, then the sql mode's. A projection's own is p.composer.
	composers []composer
	mem       *memState     // the memory mode: its tables; nil without
	sql       *sqlComposer  // the sql mode; nil without
	store     *memStore     // where mem is persisted
	pool      *pgxpool.Pool // where documents are re-read
	// maxEvent is the broker's message size limit (0: none); report counts
	// and logs a document published as an error event.
	maxEvent int
	report   func(*badRowError)
}

// composer is how the documents of the projections of one mode are found
// and composed: sqlComposer re-reads them from the database, memState
// composes them from the rows it keeps.
type composer interface {
	// observe records in d the documents change c of table t affects (the
	// memory mode applies it to its state first).
	observe(d *docChanges, t *table, c *change) error
	// observeTruncate records in d the documents a truncate of t affects
	// (the memory mode empties its table).
	observeTruncate(ctx context.Context, d *docChanges, t *table) error
	// prepare runs before transaction t's documents are composed, once d
	// holds all of them.
	prepare(ctx context.Context, d *docChanges, t *txn) error
	// recompose composes the documents of p with keys into docs (nil: no
	// such document), and why one could not be encoded into bad. buf is
	// scratch space the documents may be written into, returned for the
	// next call: docs are valid until then.
	recompose(ctx context.Context, p *docProjection, keys, docs [][]byte, bad []error, buf []byte) ([]byte, error)
}

// setComposers gives every projection the composer of its mode (the
// memory mode's when newMemState took it: e.mem, set before) and lists the
// modes used in e.composers.
func (e *docEngine) setComposers() {
	for _, p := range e.projs {
		if p.root.mem != nil {
			p.composer = e.mem
			continue
		}
		if e.sql == nil {
			e.sql = &sqlComposer{byTable: make(map[string][]*docNode), pool: e.pool, chunk: docChunk, workers: docWorkers}
		}
		e.sql.projs = append(e.sql.projs, p)
		for _, n := range p.nodes {
			e.sql.byTable[n.nameKey] = append(e.sql.byTable[n.nameKey], n)
		}
		p.composer = e.sql
	}
	if e.mem != nil {
		e.composers = append(e.composers, e.mem)
	}
	if e.sql != nil {
		e.composers = append(e.composers, e.sql)
	}
}

// events recomposes every document d names and appends their events, in
// the order of the projections and, within one, of their keys (a
// projection's truncate event first). id gives an event's id from its
// projection and key (nil: the truncate event).
func (e *docEngine) events(ctx context.Context, evs []broker.Outgoing, d *docChanges, t *txn, id func(p *docProjection, key []byte) string, flush func([]broker.Outgoing) ([]broker.Outgoing, error)) ([]broker.Outgoing, error) {
	lsn, commitTime := t.commitLSN, t.commitTime
	for _, c := range e.composers {
		if err := c.prepare(ctx, d, t); err != nil {
			return evs, err
		}
	}
	for _, p := range e.projs {
		if d.trunc[p] {
			evs = append(evs, truncateEventOn(p.subject, id(p, nil), lsn, commitTime))
		}
		set := d.keys[p]
		if len(set) == 0 {
			continue
		}
		keys := sortedKeys(set)
		// In groups, each handed to the publisher as it is composed: a
		// 100,000-document transaction is neither held whole nor waited
		// for before the first documents go.
		group := max(docChunk*docWorkers, 1024)
		var buf []byte
		docs, bad := make([][]byte, min(group, len(keys))), make([]error, min(group, len(keys)))
		for start := 0; start < len(keys); start += group {
			part := keys[start:min(start+group, len(keys))]
			docs, bad := docs[:len(part)], bad[:len(part)]
			clear(docs)
			clear(bad)
			// buf: the memory mode's documents of the group, reused by
			// the next group (each is copied into its event).
			var err error
			if buf, err = p.composer.recompose(ctx, p, part, docs, bad, buf); err != nil {
				return evs, err
			}
			for i, k := range part {
				if docs[i] == nil && bad[i] == nil && !set[string(k)] {
					continue // no such document, and its primary row did not change
				}
				evs = append(evs, e.docEvent(p, k, docs[i], bad[i], id(p, k), lsn, commitTime))
			}
			if evs, err = flush(evs); err != nil {
				return evs, err
			}
		}
	}
	return evs, nil
}

// sortedKeys lists the keys of set in byte order, in one allocation (and
// the slice's).
func sortedKeys(set map[string]bool) [][]byte {
	n := 0
	for k := range set {
		n += len(k)
	}
	arena := make([]byte, 0, n)
	keys := make([][]byte, 0, len(set))
	for k := range set {
		arena = append(arena, k...)
		keys = append(keys, arena[len(arena)-len(k):len(arena):len(arena)])
	}
	slices.SortFunc(keys, bytes.Compare)
	return keys
}

// tableEventKeys keeps, of the publication's tables, those whose table
// events were asked for (tables, as --tables names them): with projections,
// a table publishes table events only if --tables names it.
func tableEventKeys(keys map[string][]string, tables []string) map[string][]string {
	out := make(map[string][]string)
	for _, t := range tables {
		s, n := splitTable(t)
		if k, ok := keys[qualified(s, n)]; ok {
			out[qualified(s, n)] = k
		}
	}
	return out
}

// newDocEngine resolves the projections against the catalog and opens the
// pool their queries run on, with the session settings pgoutput writes
// values in (so a re-read value is the text a change carries).
func (in *Ingest) newDocEngine(ctx context.Context, conn *pgx.Conn, types *pgjson.TypeCache) (*docEngine, error) {
	cfg := &in.cfg
	projs, cat, err := resolveProjections(ctx, conn, types, cfg.Projections, cfg.Prefix, in.log)
	if err != nil {
		return nil, errFatal{err}
	}
	pcfg, err := pgxpool.ParseConfig(cfg.DSN)
	if err != nil {
		return nil, errFatal{fmt.Errorf("postgres: %w", err)}
	}
	pcfg.MaxConns = docWorkers
	maps.Copy(pcfg.ConnConfig.RuntimeParams, pgjson.OutputParams())
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, fmt.Errorf("postgres: projection pool: %w", err)
	}
	// Documents are published projection by projection, by name: their
	// order, and so their ids' (eventid.go), does not depend on the order
	// of the configuration.
	slices.SortFunc(projs, func(a, b *docProjection) int { return strings.Compare(a.spec.Name, b.spec.Name) })
	e := &docEngine{projs: projs, pool: pool, maxEvent: in.maxEvent, report: in.reportBad}
	if slices.ContainsFunc(projs, func(p *docProjection) bool { return p.spec.Mode == ModeMemory }) {
		e.mem = newMemState(projs, cat)
		in.mem.Store(e.mem)
		path := filepath.Join(cfg.StateDir, cfg.Slot+".db")
		if e.store, err = openMemStore(path, cfg.Projections); err != nil {
			pool.Close()
			return nil, errFatal{err}
		}
		lsn, err := e.store.load(e.mem)
		if err != nil {
			e.close()
			return nil, errFatal{err}
		}
		rows, bytes := e.mem.stats()
		in.log.Info("projection: memory state", zap.String("file", path), zap.Stringer("lsn", lsn), zap.Int64("rows", rows), zap.Int64("value_bytes", bytes))
	}
	e.setComposers()
	return e, nil
}

// renamed is told that a table was renamed, or moved to another schema,
// from one "schema.table" name to another: a projection names its tables
// by name, so one naming it cannot go on.
func (e *docEngine) renamed(from, to string) error {
	for _, p := range e.projs {
		for _, n := range p.nodes {
			if n.nameKey == from {
				return errFatal{fmt.Errorf("projection %q: its table %s was renamed to %s (ALTER TABLE … RENAME or SET SCHEMA): change --config to name %s, and restart", p.spec.Name, from, to, to)}
			}
		}
	}
	return nil
}

// advance stores that the memory state is at lsn, with no transaction
// between its last one and lsn (an idle slot's WAL end, about to be
// confirmed).
func (e *docEngine) advance(lsn pglogrepl.LSN) error {
	if e == nil || e.store == nil {
		return nil
	}
	return e.store.advance(e.mem, lsn)
}

// memLSN is the LSN the memory state was restored at (0: it was not, and
// must be bootstrapped), and whether there is one (memory-mode projections).
func (e *docEngine) memLSN() (pglogrepl.LSN, bool) {
	if e == nil || e.mem == nil {
		return 0, false
	}
	return e.mem.lsn, true
}

func (e *docEngine) close() {
	if e.pool != nil {
		e.pool.Close()
	}
	if e.store != nil {
		_ = e.store.close()
	}
}

// commitMem records a transaction's state changes (memory mode) for
// persisting once its events are acknowledged.
func (e *docEngine) commitMem(d *docChanges, end pglogrepl.LSN) {
	if e.mem == nil {
		return
	}
	e.mem.lsn = end
	if d.delta.n > 0 {
		d.delta.end = end
		e.mem.deltas = append(e.mem.deltas, d.delta)
		e.mem.deltaBytes += d.delta.bytes
	}
}

// heldBytes is what the memory state's deltas not yet persisted take.
func (e *docEngine) heldBytes() int64 {
	if e == nil || e.mem == nil {
		return 0
	}
	return e.mem.deltaBytes
}

// persist writes the memory state's changes up to acked; the reader
// confirms acked to PostgreSQL only after.
func (e *docEngine) persist(acked pglogrepl.LSN) error {
	if e == nil || e.store == nil {
		return nil
	}
	return e.store.persist(e.mem, acked)
}
