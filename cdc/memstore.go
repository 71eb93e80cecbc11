package cdc

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/jackc/pglogrepl"
	bolt "go.etcd.io/bbolt"
)

// memStore persists the memory mode's state in a bbolt file, one bucket per
// table (row key → encoded row) and a meta bucket with the LSN the state is
// at and a hash of the projections it was built for.
//
// The state on disk is only ever at a transaction boundary whose events
// the broker has acknowledged: the reader writes the deltas of the
// transactions up to the acknowledged LSN (persist), and only then
// confirms that LSN to PostgreSQL. After a restart PostgreSQL resends from
// what was confirmed, at or before the stored LSN; transactions up to the
// stored LSN are skipped (their state and events are done), and the rest
// applied. A document is never composed from a state that mixes two
// points in time.
type memStore struct {
	db     *bolt.DB
	hash   []byte
	stored pglogrepl.LSN // the LSN in the file; owned by the reader
}

var (
	metaBucket = []byte("meta")
	lsnKey     = []byte("lsn")
	hashKey    = []byte("projections")
)

// openMemStore opens (creating) the store at path, for projections specs.
func openMemStore(path string, specs []ProjectionSpec) (*memStore, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("memory state: %w", err)
	}
	// The hashmap freelist: the array one allocates in time linear in the
	// free pages, which made writing a 410,000-row state take minutes.
	db, err := bolt.Open(path, 0o600, &bolt.Options{NoFreelistSync: true, FreelistType: bolt.FreelistMapType})
	if err != nil {
		return nil, fmt.Errorf("memory state %s: %w", path, err)
	}
	// The state is for the memory-mode projections, in any order: a change
	// of the sql-mode ones, or of the order, leaves it valid.
	var mem []ProjectionSpec
	for _, p := range specs {
		if p.Mode == ModeMemory {
			mem = append(mem, p)
		}
	}
	slices.SortFunc(mem, func(a, b ProjectionSpec) int { return strings.Compare(a.Name, b.Name) })
	b, _ := json.Marshal(mem)
	h := sha256.Sum256(b)
	return &memStore{db: db, hash: h[:]}, nil
}

func (s *memStore) close() error { return s.db.Close() }

// load reads the state into st if it was stored for the same projections,
// and returns its LSN (0: nothing usable stored; st is left empty).
func (s *memStore) load(st *memState) (pglogrepl.LSN, error) {
	var lsn pglogrepl.LSN
	err := s.db.View(func(tx *bolt.Tx) error {
		meta := tx.Bucket(metaBucket)
		if meta == nil || string(meta.Get(hashKey)) != string(s.hash) {
			return nil
		}
		v := meta.Get(lsnKey)
		if len(v) != 8 {
			return nil
		}
		for name, t := range st.tables {
			b := tx.Bucket([]byte(name))
			if b == nil {
				continue
			}
			if err := b.ForEach(func(k, v []byte) error {
				t.insert(k, v) // a copy: bbolt's bytes live only as long as its transaction
				return nil
			}); err != nil {
				return err
			}
		}
		lsn = pglogrepl.LSN(binary.BigEndian.Uint64(v))
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("memory state: load: %w", err)
	}
	st.lsn, s.stored = lsn, lsn
	return lsn, nil
}

// writeAll replaces the stored state by st, at lsn (after a bootstrap).
func (s *memStore) writeAll(st *memState, lsn pglogrepl.LSN) error {
	err := s.db.Update(func(tx *bolt.Tx) error {
		for name, t := range st.tables {
			if err := tx.DeleteBucket([]byte(name)); err != nil && !errors.Is(err, bolt.ErrBucketNotFound) {
				return err
			}
			b, err := tx.CreateBucket([]byte(name))
			if err != nil {
				return err
			}
			b.FillPercent = 0.9 // written in key order: pages fill up
			// In key order: the rows' keys in one buffer, sorted by
			// reference.
			type keyed struct {
				id         uint32
				start, end int
			}
			var kb []byte
			keys := make([]keyed, 0, t.n)
			for id := uint32(1); id < uint32(len(t.slots)); id++ {
				if row, ok := t.rowAt(id); ok {
					start := len(kb)
					kb = t.appendKey(kb, row)
					keys = append(keys, keyed{id, start, len(kb)})
				}
			}
			slices.SortFunc(keys, func(a, b keyed) int { return bytes.Compare(kb[a.start:a.end], kb[b.start:b.end]) })
			for _, k := range keys {
				if err := b.Put(kb[k.start:k.end:k.end], t.row(k.id)); err != nil {
					return err
				}
			}
		}
		return s.putMeta(tx, lsn)
	})
	if err != nil {
		return fmt.Errorf("memory state: write: %w", err)
	}
	st.deltas = nil
	st.lsn, s.stored = lsn, lsn
	return nil
}

func (s *memStore) putMeta(tx *bolt.Tx, lsn pglogrepl.LSN) error {
	meta, err := tx.CreateBucketIfNotExists(metaBucket)
	if err != nil {
		return err
	}
	var v [8]byte
	binary.BigEndian.PutUint64(v[:], uint64(lsn))
	if err := meta.Put(lsnKey, v[:]); err != nil {
		return err
	}
	return meta.Put(hashKey, s.hash)
}

// persist writes the deltas of the transactions that end at or before
// acked, in one transaction, and drops them from st. The state is then
// stored at acked, not at its last delta's end: the transactions after it
// changed no memory table, and acked is what the reader confirms next. A
// state stored behind its slot's confirmed LSN looks stale and is
// bootstrapped again.
func (s *memStore) persist(st *memState, acked pglogrepl.LSN) error {
	n := 0
	for n < len(st.deltas) && st.deltas[n].end <= acked {
		n++
	}
	if n == 0 && acked <= s.stored {
		return nil
	}
	end := max(acked, s.stored)
	err := s.db.Update(func(tx *bolt.Tx) error {
		for _, d := range st.deltas[:n] {
			for _, chunk := range d.ops {
				for _, op := range chunk {
					name := []byte(op.table)
					if op.clear {
						if err := tx.DeleteBucket(name); err != nil && !errors.Is(err, bolt.ErrBucketNotFound) {
							return err
						}
						continue
					}
					b, err := tx.CreateBucketIfNotExists(name)
					if err != nil {
						return err
					}
					if op.row == nil {
						err = b.Delete(op.key)
					} else {
						err = b.Put(op.key, op.row)
					}
					if err != nil {
						return err
					}
				}
			}
		}
		return s.putMeta(tx, end)
	})
	if err != nil {
		return fmt.Errorf("memory state: persist: %w", err)
	}
	for _, d := range st.deltas[:n] {
		st.deltaBytes -= d.bytes
	}
	clear(st.deltas[:n])
	st.deltas = st.deltas[n:]
	s.stored = end
	return nil
}

// advance moves the stored state's LSN to lsn when nothing is waiting to
// be written: the ingest confirms an idle slot's WAL end, past the last
// transaction the state holds, and a state behind its slot's confirmed
// LSN would otherwise look stale (ingest.go bootstraps such a state).
func (s *memStore) advance(st *memState, lsn pglogrepl.LSN) error {
	if len(st.deltas) > 0 || lsn <= st.lsn {
		return nil
	}
	if err := s.db.Update(func(tx *bolt.Tx) error { return s.putMeta(tx, lsn) }); err != nil {
		return fmt.Errorf("memory state: persist: %w", err)
	}
	st.lsn, s.stored = lsn, lsn
	return nil
}
