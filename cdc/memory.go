package cdc

import (
	"hash/maphash"
	"slices"
	"sync/atomic"
	"unsafe"

	"github.com/jackc/pglogrepl"
)

// The memory mode keeps the projected columns of every row of a
// projection's tables in memory, with the indexes its joins need, and
// applies each change as it is decoded: a document is composed from that
// state as of its transaction's commit, with no query, so every document
// published existed at some commit (the sql mode re-reads the database,
// which may have moved on). The state is persisted with the LSN it is at
// (memstore.go), so a restart resumes from there. This file is the state;
// its tables are in memtable.go, their rows in memarena.go, their indexes
// in memindex.go; changes are applied to it in memory_apply.go, documents
// composed from it in memory_compose.go.

// memState is every memory-mode table, owned by the reader: the memory
// mode's composer.
type memState struct {
	rows    atomic.Int64 // rows held, for metrics (read by other goroutines)
	bytes   atomic.Int64 // bytes of their encoded values
	tables  map[string]*memTable
	byTable map[string][]*docNode // "schema.table" → the memory-mode nodes on that table
	lsn     pglogrepl.LSN         // the end of the last transaction applied
	// deltas not yet persisted, by transaction (memstore.go), and what
	// they take (memTxDelta.bytes): held until the broker acknowledges
	// their transactions, they count in Config.MaxTxnMemory
	deltas     []memTxDelta
	deltaBytes int64
	seed       maphash.Seed // of the hashes of row keys and index tuples
	// scratch space of applying changes: the key looked up, a row's values
	// and their encoding, an index's tuples of a row before and after, the
	// tuples walked up to the documents (by depth)
	key, enc, ixOld, ixNew []byte
	vals                   [][]byte
	upKeys                 [][]byte
	// scratch is reused by every document composed from the state.
	scratch memScratch
}

// memTxDelta is what one transaction changed in the state: its ops in
// chunks of up to memOpChunk, their keys in buffers of up to memKeyChunk
// bytes, each twice the last (a one-row transaction's delta stays small:
// many of them wait for the broker's acknowledgement at once). One slice
// grown by copying, and a string per key, were two fifths of applying a
// 100,000-row UPDATE (BenchmarkMemDocuments/apply).
type memTxDelta struct {
	end   pglogrepl.LSN
	ops   [][]memOp
	keys  []byte // the last chunk of keys, filled up to its length
	n     int    // ops
	bytes int64  // what ops take beyond the rows, which the state holds anyway
}

const (
	memOpChunk  = 1024
	memKeyChunk = 64 << 10
)

// memOpMem is what a memOp takes, beyond its key's bytes.
const memOpMem = int64(unsafe.Sizeof(memOp{}))

// add records that key of table was set to row (nil: deleted), or with
// clear that table was truncated. The delta keeps a copy of key, and row.
func (d *memTxDelta) add(table string, key, row []byte, clear bool) {
	if n := len(d.ops); n == 0 || len(d.ops[n-1]) == cap(d.ops[n-1]) {
		size := 4
		if n > 0 {
			size = min(memOpChunk, 2*cap(d.ops[n-1]))
		}
		d.ops = append(d.ops, make([]memOp, 0, size))
	}
	if cap(d.keys)-len(d.keys) < len(key) {
		d.keys = make([]byte, 0, max(min(memKeyChunk, 2*cap(d.keys)), 64, len(key)))
	}
	start := len(d.keys)
	d.keys = append(d.keys, key...)
	last := &d.ops[len(d.ops)-1]
	*last = append(*last, memOp{table: table, key: d.keys[start:len(d.keys):len(d.keys)], row: row, clear: clear})
	d.n++
	d.bytes += memOpMem + int64(len(key))
}

type memOp struct {
	table string
	key   []byte
	row   []byte // nil: deleted
	clear bool   // the table was truncated
}

// memNodeInfo is what the memory mode needs of a node: its table, the
// index finding its rows by its join columns (children), and the index
// finding its parent's rows by the parent's join columns.
type memNodeInfo struct {
	t        *memTable
	byJoin   *memIndex // this node's rows by its child-side join columns
	parentIx *memIndex // the parent's rows by the parent-side join columns; nil when direct
	order    []int     // cols of t ordering a many list
	orderOID []uint32
	docCols  []int // cols of t holding the node's document columns, in their order
	// onParent are the cols of the parent's table holding the parent side
	// of the join, in the order of on, and onOID their types.
	onParent []int
	onOID    []uint32
}

// newMemState sizes the state for the memory-mode projections: the
// columns each table keeps (document columns, join columns, keys,
// ordering) and the indexes.
func newMemState(projs []*docProjection, cat map[string]*catalogTable) *memState {
	s := &memState{tables: make(map[string]*memTable), byTable: make(map[string][]*docNode), seed: maphash.MakeSeed()}
	need := make(map[string][]string)
	add := func(t string, cols ...string) {
		for _, c := range cols {
			if !slices.Contains(need[t], c) {
				need[t] = append(need[t], c)
			}
		}
	}
	for _, p := range projs {
		if p.spec.Mode != ModeMemory {
			continue
		}
		for _, n := range p.nodes {
			ct := cat[n.nameKey]
			add(n.nameKey, ct.pkey...)
			for _, c := range n.cols {
				add(n.nameKey, c.name)
			}
			for _, j := range n.on {
				add(n.nameKey, j.child.name)
				add(n.parent.nameKey, j.parent.name)
			}
			add(n.nameKey, n.orderCols...)
		}
	}
	for name, cols := range need {
		s.tables[name] = newMemTable(s, name, cols, cat[name])
	}
	for _, p := range projs {
		if p.spec.Mode != ModeMemory {
			continue
		}
		for _, n := range p.nodes {
			info := &memNodeInfo{t: s.tables[n.nameKey]}
			if n.parent != nil {
				var cc, pc []string
				for _, j := range n.on {
					cc = append(cc, j.child.name)
					pc = append(pc, j.parent.name)
				}
				info.byJoin = info.t.index(cc)
				// Direct to the document's key, unless equal keys can be
				// written differently: then through an index on the key.
				if !(n.parent.parent == nil && len(pc) == 1 && pc[0] == p.key.name && !textVaries(p.key.ctype.OID)) {
					info.parentIx = s.tables[n.parent.nameKey].index(pc)
				}
			}
			for _, c := range n.cols {
				info.docCols = append(info.docCols, info.t.colIdx[c.name])
			}
			for _, j := range n.on {
				info.onParent = append(info.onParent, s.tables[n.parent.nameKey].colIdx[j.parent.name])
				info.onOID = append(info.onOID, j.parent.ctype.OID)
			}
			for _, c := range n.orderCols {
				info.order = append(info.order, info.t.colIdx[c])
				info.orderOID = append(info.orderOID, info.t.cols[info.t.colIdx[c]].ctype.OID)
			}
			n.mem = info
			s.byTable[n.nameKey] = append(s.byTable[n.nameKey], n)
		}
	}
	return s
}

// stats reports the state's rows and the bytes their encoded values take.
func (s *memState) stats() (rows, valueBytes int64) {
	return s.rows.Load(), s.bytes.Load()
}
