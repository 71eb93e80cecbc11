package cdc

import (
	"unsafe"

	"go.uber.org/zap"
)

// Holding open transactions. pgoutput sends a transaction's changes before
// its commit (a streamed one in pieces, interleaved with others), so the
// reader holds them until then. Together they stay under
// Config.MaxTxnMemory: past it the largest moves to a spill file, as do
// all its later changes, and its commit reads them back. A transaction
// that fits (nearly all) pays for none of it: its changes are a slice and
// a running size.
//
// A held change is the pgoutput message as received, copied into its
// transaction's arena (blocks of 256 B doubling to 64 KiB), with the table
// definition it is decoded with: it is decoded, into reused memory, only
// when its transaction commits (changeDecoder), straight into its event.
// Held decoded (a tuple, its columns, the pointers to them: 4 allocations
// and ~450 B a change of 5 columns), a 100,000-row UPDATE outgrew the
// default --max-txn-memory and spilled, and the reader's path took 2,084
// CPU ns a change (BenchmarkTailChangesBig; the deployed ingest spent
// 4.5–5.9 µs in all); held as messages, ~140 B a change and one pointer,
// the transaction fits, and the path takes 817 ns.

// heldChange is a change held until its transaction commits.
type heldChange struct {
	msg    []byte   // the Insert, Update or Delete message as pgoutput sent it (in its transaction's arena); nil for a truncate
	tbl    *table   // the table as the Relation message before the change defined it (nil: none came)
	truncs []*table // a truncate: the truncated tables, as defined then
	xid    uint32   // the (sub)transaction that made it (streamed transactions)
	stream bool     // msg is a streamed transaction's (it names its xid)
}

// heldMem is what a held change takes beyond its message.
const heldMem = int64(unsafe.Sizeof(heldChange{}))

// heldSize estimates the memory a held change takes. The same change
// always gives the same size, so a dropped change gives back exactly what
// it took.
func heldSize(h *heldChange) int64 {
	return heldMem + int64(len(h.msg)) + 8*int64(len(h.truncs))
}

// A transaction's messages are copied into blocks that double from
// arenaFirst to arenaBlock bytes; a bigger message (a large value) takes a
// block of its own. (64 KiB from the first change: 40,000 single-row
// transactions then allocated and cleared 2.6 GB, 58 µs of CPU a change.)
const (
	arenaFirst = 256
	arenaBlock = 64 << 10
)

// msgArena holds the messages of one transaction's changes: they are
// copied into shared blocks, which the GC frees with the last change
// pointing into them (it scans no pointer in them).
type msgArena struct{ block []byte }

// keep copies msg into the arena and returns the copy.
func (a *msgArena) keep(msg []byte) []byte {
	if cap(a.block)-len(a.block) < len(msg) {
		n := min(arenaBlock, max(arenaFirst, 2*cap(a.block)))
		a.block = make([]byte, 0, max(n, len(msg)))
	}
	start := len(a.block)
	a.block = append(a.block, msg...)
	return a.block[start:len(a.block):len(a.block)]
}

// add holds a change for the open transaction, or for its streamed
// transaction (h.xid is the change's own (sub)transaction). h.msg is the
// receive buffer's: it is copied.
func (r *reader) add(h heldChange) error {
	t := r.cur
	if r.inStream {
		if t = r.streamed[r.streamXid]; t == nil {
			t = &txn{xid: r.streamXid}
			r.streamed[r.streamXid] = t
		}
	} else {
		h.xid = 0
	}
	if t == nil {
		return nil
	}
	if t.spill != nil {
		n, err := t.spill.write(&h)
		r.in.spillB.Add(uint64(n))
		return err
	}
	if h.msg != nil {
		h.msg = t.arena.keep(h.msg)
	}
	n := heldSize(&h)
	t.changes.add(h)
	t.mem += n
	r.held += n
	if r.held+r.docsHeld() <= r.in.cfg.MaxTxnMemory {
		return nil
	}
	return r.spill(r.largest())
}

// docsHeld is what committed transactions still hold for their documents:
// the documents waiting for the flush window, and the memory state's
// changes waiting for the broker's ack. They count in MaxTxnMemory too: an
// open transaction spills sooner while they are big.
func (r *reader) docsHeld() int64 {
	n := r.docs.heldBytes()
	if r.pend != nil {
		n += r.pend.bytes
	}
	return n
}

// largest is the held transaction with the most changes in memory.
func (r *reader) largest() *txn {
	big := r.cur
	for _, t := range r.streamed {
		if big == nil || t.mem > big.mem {
			big = t
		}
	}
	return big
}

// spill moves t's changes to a spill file, where its later changes go too.
func (r *reader) spill(t *txn) error {
	f, err := newSpillFile(r.in.cfg.StateDir, r.in.cfg.Slot, t.xid)
	if err != nil {
		return err
	}
	t.spill = f // removed with t, even if a write fails
	var written uint64
	if err := t.changes.each(func(h *heldChange) error {
		n, err := f.write(h)
		written += uint64(n)
		return err
	}); err != nil {
		return err
	}
	r.in.spilled.Add(1)
	r.in.spillB.Add(written)
	r.in.log.Info("ingest: a transaction outgrew --max-txn-memory; its changes go to a spill file",
		zap.Uint32("xid", t.xid), zap.Int("changes", t.changes.len()), zap.Int64("held_bytes", t.mem), zap.String("file", f.f.Name()))
	r.held -= t.mem
	t.changes, t.mem, t.arena = changeList{}, 0, msgArena{}
	return nil
}

// abortSub drops the changes of t's rolled-back subtransaction xid. Their
// messages stay in t's arena blocks, and their places in its change list,
// until t ends or is spilled: so they stay counted in t.mem and r.held
// (MaxTxnMemory), which spilling t frees. Uncounted, a streamed
// transaction whose subtransactions roll back over and over would grow
// past the bound unseen.
func (r *reader) abortSub(t *txn, xid uint32) {
	r.in.log.Debug("ingest: a streamed transaction's subtransaction rolled back; its changes are dropped",
		zap.Uint32("xid", t.xid), zap.Uint32("subxid", xid), zap.Bool("spilled", t.spill != nil))
	if t.spill != nil {
		t.spill.abort(xid)
	}
	t.changes.filter(func(h *heldChange) bool { return h.xid != xid })
}

// release lets t's changes go: it is committed (its changes are being
// used) or aborted. Its spill file, if any, is removed by done.
func (r *reader) release(t *txn) {
	r.held -= t.mem
	t.mem = 0
	t.arena = msgArena{} // nothing more is added; its held changes keep the blocks they point into
}

// done removes t's spill file, if any, and, when no transaction is held
// any more, the table definitions no change points to.
func (r *reader) done(t *txn) {
	if err := t.spill.remove(); err != nil {
		r.in.log.Warn("ingest: remove a spill file", zap.Error(err))
	}
	t.spill = nil
	if r.cur == nil && len(r.streamed) == 0 && r.rels != nil {
		r.rels.prune()
	}
}

// close lets every held transaction go and removes their spill files
// (the reader ends; PostgreSQL resends them to the next one).
func (r *reader) close() {
	if r.cur != nil {
		r.release(r.cur)
		r.done(r.cur)
		r.cur = nil
	}
	for xid, t := range r.streamed {
		r.release(t)
		r.done(t)
		delete(r.streamed, xid)
	}
}

// changeChunk is the number of changes in each chunk of a changeList but
// its first, which grows to it as a slice does.
const changeChunk = 256 // 16 KiB of held changes

// changeList is a held transaction's changes, in order, in chunks of
// changeChunk: a big transaction's list grows without copying itself (a
// slice of 80,000 changes, grown by append, allocates and copies several
// times its final 5 MiB on the way, with the GC assists that brings), and
// a small transaction's is one slice, as before.
type changeList struct {
	first []heldChange   // changes [0, changeChunk)
	more  [][]heldChange // chunk i holds changes [(i+1)*changeChunk, (i+2)*changeChunk)
}

func (l *changeList) len() int {
	if len(l.more) == 0 {
		return len(l.first)
	}
	return len(l.more)*changeChunk + len(l.more[len(l.more)-1])
}

// at is the i-th change, i < len().
func (l *changeList) at(i int) *heldChange {
	if i < changeChunk {
		return &l.first[i]
	}
	return &l.more[i/changeChunk-1][i%changeChunk]
}

// add appends c.
func (l *changeList) add(c heldChange) {
	if len(l.first) < changeChunk {
		l.first = append(l.first, c)
		return
	}
	k := len(l.more) - 1
	if k < 0 || len(l.more[k]) == changeChunk {
		l.more = append(l.more, make([]heldChange, 0, changeChunk))
		k++
	}
	l.more[k] = append(l.more[k], c)
}

// each calls fn with each change, in order, until it returns an error.
func (l *changeList) each(fn func(*heldChange) error) error {
	for i := range l.first {
		if err := fn(&l.first[i]); err != nil {
			return err
		}
	}
	for _, ch := range l.more {
		for i := range ch {
			if err := fn(&ch[i]); err != nil {
				return err
			}
		}
	}
	return nil
}

// consume calls fn with each change, in order, and lets each go once fn
// returns (a chunk as soon as all its changes are used): the list is
// empty after, or holds what fn did not reach after an error.
func (l *changeList) consume(fn func(*heldChange) error) error {
	for i := range l.first {
		if err := fn(&l.first[i]); err != nil {
			return err
		}
		l.first[i] = heldChange{}
	}
	l.first = nil
	for k, ch := range l.more {
		for i := range ch {
			if err := fn(&ch[i]); err != nil {
				return err
			}
			ch[i] = heldChange{}
		}
		l.more[k] = nil
	}
	l.more = nil
	return nil
}

// filter keeps the changes keep returns true for, in order, and lets the
// others go.
func (l *changeList) filter(keep func(*heldChange) bool) {
	n, w := l.len(), 0
	for i := range n {
		c := l.at(i)
		if !keep(c) {
			continue
		}
		if w != i {
			*l.at(w) = *c
		}
		w++
	}
	for i := w; i < n; i++ {
		*l.at(i) = heldChange{} // let the dropped rows go
	}
	// Shorten to w: the first chunk, and the chunks the kept changes reach.
	if w < changeChunk {
		l.first = l.first[:w]
		clear(l.more)
		l.more = l.more[:0]
		return
	}
	k := (w - changeChunk + changeChunk - 1) / changeChunk // chunks of more kept
	clear(l.more[k:])
	l.more = l.more[:k]
	if k > 0 {
		l.more[k-1] = l.more[k-1][:w-k*changeChunk]
	}
}
