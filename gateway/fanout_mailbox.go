package gateway

import (
	"context"
	"sync"
	"time"
)

// mailbox is a connection's bounded queue of deliveries. Producers (the hub's
// dispatcher and the connection's reader, for replies) never block: push fails
// when the mailbox is over either bound and the connection is then closed as a
// slow consumer. The connection's writer takes everything queued at once.
//
// Items are 16 bytes and point at shared events. They are stored in 2 KiB
// segments from a pool, linked as they fill: memory follows what is queued
// (a doubling slice would keep up to twice the peak, twice over with double
// buffering), and an idle connection holds no segment at all.
//
// Layout: every push touches only the fields up to closed, which fit in the
// first 48 bytes so that, with client's alignment, one push costs one cache
// line of the client. docs/benchmarks.md ("Hot-path microbenchmarks") has
// the figures behind both choices.
type mailbox struct {
	mu       sync.Mutex
	n        int32    // guarded by mu; queued items
	tpos     int32    // guarded by mu; next free slot in tail
	bytes    int      // guarded by mu; queued bytes
	tail     *segment // guarded by mu
	maxBytes int      // static
	maxItems int32    // static
	closed   bool     // guarded by mu
	head     *segment // guarded by mu; nil when empty
	taken    uint64   // guarded by mu; items handed to the writer so far (off the push path's cache line)
}

// segItems fills a segment's size class: 127 items and the link are 2,040
// bytes, in the allocator's 2,048-byte class (128 were 2,056, rounded up to
// 2,304: 248 bytes lost per segment).
const segItems = 127

type segment struct {
	items [segItems]item
	next  *segment
}

var segPool = sync.Pool{New: func() any { return new(segment) }}

// appendLocked adds it, of size bytes; m.mu is held.
func (m *mailbox) appendLocked(it item, size int) {
	if m.tail == nil || m.tpos == segItems {
		s := segPool.Get().(*segment)
		if m.tail == nil {
			m.head = s
		} else {
			m.tail.next = s
		}
		m.tail, m.tpos = s, 0
	}
	m.tail.items[m.tpos] = it
	m.tpos++
	m.n++
	m.bytes += size
}

// Fill levels reported by push.
const (
	fillLow      = iota // at most half of both bounds
	fillHalf            // over half of a bound
	fillCritical        // over three quarters of a bound: about to overflow
)

// push queues it, whose size (it.size(), passed in so the caller can use a
// cached value) is n. It reports whether the mailbox was empty, in which
// case the caller must wake the writer (possibly later, once per batch),
// and the mailbox's fill level afterwards. It returns ErrMailboxFull when
// the mailbox is over a bound or closed.
func (m *mailbox) push(it item, n int) (wasEmpty bool, fill int, err error) {
	m.mu.Lock()
	if m.closed || m.n >= m.maxItems || m.bytes+n > m.maxBytes {
		m.mu.Unlock()
		return false, fillLow, ErrMailboxFull
	}
	wasEmpty = m.n == 0
	m.appendLocked(it, n)
	switch {
	case 4*m.n > 3*m.maxItems || 4*m.bytes > 3*m.maxBytes:
		fill = fillCritical
	case 2*m.n > m.maxItems || 2*m.bytes > m.maxBytes:
		fill = fillHalf
	}
	m.mu.Unlock()
	return wasEmpty, fill, nil
}

// pushControl queues a reply. Replies count against both bounds, as
// events do: a client that keeps asking and does not read is a slow
// consumer. A reply that could be big (members, a view's synced, a GraphQL
// query's result) is paged or refused by its producer before it could
// exceed the whole byte bound (docs/protocol.md, "Replies and the mailbox").
func (m *mailbox) pushControl(it item) (wasEmpty bool, err error) {
	n := it.size()
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed || m.n >= m.maxItems || m.bytes+n > m.maxBytes {
		return false, ErrMailboxFull
	}
	wasEmpty = m.n == 0
	m.appendLocked(it, n)
	return wasEmpty, nil
}

// room is how many more items fit.
func (m *mailbox) room() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return int(m.maxItems - m.n)
}

// free is how many more bytes fit.
func (m *mailbox) free() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.maxBytes - m.bytes
}

// overHalf reports whether the mailbox is over half of either bound.
func (m *mailbox) overHalf() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return 2*m.n > m.maxItems || 2*m.bytes > m.maxBytes
}

// batch is what take hands the writer: a chain of segments it owns until
// release.
type batch struct {
	head *segment
	tail *segment
	tpos int // items used in tail
	n    int
}

// take detaches everything queued; the mailbox starts empty again.
func (m *mailbox) take() batch {
	m.mu.Lock()
	b := batch{head: m.head, tail: m.tail, tpos: int(m.tpos), n: int(m.n)}
	m.taken += uint64(m.n)
	m.head, m.tail, m.tpos, m.n, m.bytes = nil, nil, 0, 0, 0
	m.mu.Unlock()
	return b
}

// pushes is the number of items pushed so far (while open): those taken
// plus those queued. Once the writer has written that many, every item
// pushed before the call is on the wire.
func (m *mailbox) pushes() uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.taken + uint64(m.n)
}

// used returns segment s's queued items; s is one of the batch's segments.
func (b *batch) used(s *segment) []item {
	if s == b.tail {
		return s.items[:b.tpos]
	}
	return s.items[:]
}

// next returns the segment after s, or nil after the last.
func (b *batch) next(s *segment) *segment {
	if s == b.tail {
		return nil
	}
	return s.next
}

// release returns the batch's segments to the pool, cleared so they pin no
// events.
func (b *batch) release() {
	for s := b.head; s != nil; {
		next := s.next
		if s == b.tail {
			clear(s.items[:b.tpos])
			next = nil
		} else {
			clear(s.items[:])
		}
		s.next = nil
		segPool.Put(s)
		s = next
	}
	*b = batch{}
}

// close refuses every later push and drops what is queued.
func (m *mailbox) close() {
	b := func() batch {
		m.mu.Lock()
		defer m.mu.Unlock()
		m.closed = true
		b := batch{head: m.head, tail: m.tail, tpos: int(m.tpos)}
		m.head, m.tail, m.tpos, m.n, m.bytes = nil, nil, 0, 0, 0
		return b
	}()
	b.release()
}

// depth is what is queued: items and bytes (the inspector's).
func (m *mailbox) depth() (items, bytes int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return int(m.n), m.bytes
}

// len is the number of queued items (for tests and metrics).
func (m *mailbox) len() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return int(m.n)
}

// waitRoom waits until the mailbox is at most half full: a replay, unlike
// the dispatcher, is one connection's producer and may wait for its writer.
func (m *mailbox) waitRoom(ctx context.Context) error {
	return m.waitUntil(ctx, func() bool { return !m.overHalf() })
}

// waitFree waits until n more bytes fit (n at most maxBytes: a resume's
// hand-over that needs room for a view's synced).
func (m *mailbox) waitFree(ctx context.Context, n int) error {
	return m.waitUntil(ctx, func() bool { return m.free() >= n })
}

func (m *mailbox) waitUntil(ctx context.Context, ok func() bool) error {
	for !ok() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Millisecond):
		}
	}
	return nil
}
