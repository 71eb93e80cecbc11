package fanout

import (
	"context"
	"math"
	"sync"
	"time"
)

// Mailbox is a connection's bounded queue of deliveries. Producers (the hub's
// dispatcher and the connection's reader, for replies) never block: Push fails
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
type Mailbox struct {
	mu       sync.Mutex
	n        int32    // guarded by mu; queued items
	tpos     int32    // guarded by mu; next free slot in tail
	bytes    int      // guarded by mu; queued bytes
	tail     *Segment // guarded by mu
	maxBytes int      // static
	maxItems int32    // static
	closed   bool     // guarded by mu
	head     *Segment // guarded by mu; nil when empty
	taken    uint64   // guarded by mu; items handed to the writer so far (off the push path's cache line)
}

// SegmentItems fills a segment's size class: 127 items and the link are 2,040
// bytes, in the allocator's 2,048-byte class (128 were 2,056, rounded up to
// 2,304: 248 bytes lost per segment).
const SegmentItems = 127

// Segment is a block of a mailbox's items, which a Batch hands over.
type Segment struct {
	items [SegmentItems]Item
	next  *Segment
}

var segPool = sync.Pool{New: func() any { return new(Segment) }}

// appendLocked adds it, of size bytes; m.mu is held.
func (m *Mailbox) appendLocked(it Item, size int) {
	if m.tail == nil || m.tpos == SegmentItems {
		s := segPool.Get().(*Segment)
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

// Fill levels reported by Push.
const (
	FillLow      = iota // at most half of both bounds
	FillHalf            // over half of a bound
	FillCritical        // over three quarters of a bound: about to overflow
)

// Push queues it, whose size (it.Size(), passed in so the caller can use a
// cached value) is n. It reports whether the mailbox was empty, in which
// case the caller must wake the writer (possibly later, once per batch),
// and the mailbox's fill level afterwards. It returns ErrMailboxFull when
// the mailbox is over a bound or closed.
func (m *Mailbox) Push(it Item, n int) (wasEmpty bool, fill int, err error) {
	m.mu.Lock()
	if m.closed || m.n >= m.maxItems || m.bytes+n > m.maxBytes {
		m.mu.Unlock()
		return false, FillLow, ErrMailboxFull
	}
	wasEmpty = m.n == 0
	m.appendLocked(it, n)
	switch {
	case 4*m.n > 3*m.maxItems || 4*m.bytes > 3*m.maxBytes:
		fill = FillCritical
	case 2*m.n > m.maxItems || 2*m.bytes > m.maxBytes:
		fill = FillHalf
	}
	m.mu.Unlock()
	return wasEmpty, fill, nil
}

// PushControl queues a reply. Replies count against both bounds, as
// events do: a client that keeps asking and does not read is a slow
// consumer. A reply that could be big (members, a view's synced, a GraphQL
// query's result) is paged or refused by its producer before it could
// exceed the whole byte bound (docs/protocol.md, "Replies and the mailbox").
func (m *Mailbox) PushControl(it Item) (wasEmpty bool, err error) {
	n := it.Size()
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed || m.n >= m.maxItems || m.bytes+n > m.maxBytes {
		return false, ErrMailboxFull
	}
	wasEmpty = m.n == 0
	m.appendLocked(it, n)
	return wasEmpty, nil
}

// Init sets the mailbox's bounds, before its first use.
func (m *Mailbox) Init(maxItems, maxBytes int) {
	m.maxItems, m.maxBytes = int32(min(maxItems, math.MaxInt32)), maxBytes
}

// MaxBytes is the mailbox's byte bound.
func (m *Mailbox) MaxBytes() int { return m.maxBytes }

// Room is how many more items fit.
func (m *Mailbox) Room() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return int(m.maxItems - m.n)
}

// Free is how many more bytes fit.
func (m *Mailbox) Free() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.maxBytes - m.bytes
}

// OverHalf reports whether the mailbox is over half of either bound.
func (m *Mailbox) OverHalf() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return 2*m.n > m.maxItems || 2*m.bytes > m.maxBytes
}

// Batch is what Take hands the writer: a chain of segments it owns until
// Release.
type Batch struct {
	head *Segment
	tail *Segment
	tpos int // items used in tail
	n    int
}

// Take detaches everything queued; the mailbox starts empty again.
func (m *Mailbox) Take() Batch {
	m.mu.Lock()
	b := Batch{head: m.head, tail: m.tail, tpos: int(m.tpos), n: int(m.n)}
	m.taken += uint64(m.n)
	m.head, m.tail, m.tpos, m.n, m.bytes = nil, nil, 0, 0, 0
	m.mu.Unlock()
	return b
}

// Pushes is the number of items pushed so far (while open): those taken
// plus those queued. Once the writer has written that many, every item
// pushed before the call is on the wire.
func (m *Mailbox) Pushes() uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.taken + uint64(m.n)
}

// First is the batch's first segment (nil when it is empty).
func (b *Batch) First() *Segment { return b.head }

// Len is the number of items in the batch.
func (b *Batch) Len() int { return b.n }

// Used returns segment s's queued items; s is one of the batch's segments.
func (b *Batch) Used(s *Segment) []Item {
	if s == b.tail {
		return s.items[:b.tpos]
	}
	return s.items[:]
}

// Next returns the segment after s, or nil after the last.
func (b *Batch) Next(s *Segment) *Segment {
	if s == b.tail {
		return nil
	}
	return s.next
}

// Release returns the batch's segments to the pool, cleared so they pin no
// events.
func (b *Batch) Release() {
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
	*b = Batch{}
}

// Close refuses every later push and drops what is queued.
func (m *Mailbox) Close() {
	b := func() Batch {
		m.mu.Lock()
		defer m.mu.Unlock()
		m.closed = true
		b := Batch{head: m.head, tail: m.tail, tpos: int(m.tpos)}
		m.head, m.tail, m.tpos, m.n, m.bytes = nil, nil, 0, 0, 0
		return b
	}()
	b.Release()
}

// Depth is what is queued: items and bytes (the inspector's).
func (m *Mailbox) Depth() (items, bytes int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return int(m.n), m.bytes
}

// Len is the number of queued items (for tests and metrics).
func (m *Mailbox) Len() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return int(m.n)
}

// WaitRoom waits until the mailbox is at most half full: a replay, unlike
// the dispatcher, is one connection's producer and may wait for its writer.
func (m *Mailbox) WaitRoom(ctx context.Context) error {
	return m.waitUntil(ctx, func() bool { return !m.OverHalf() })
}

// WaitFree waits until n more bytes fit (n at most MaxBytes: a resume's
// hand-over that needs room for a view's synced).
func (m *Mailbox) WaitFree(ctx context.Context, n int) error {
	return m.waitUntil(ctx, func() bool { return m.Free() >= n })
}

func (m *Mailbox) waitUntil(ctx context.Context, ok func() bool) error {
	for !ok() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Millisecond):
		}
	}
	return nil
}
