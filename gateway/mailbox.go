package gateway

import "sync"

// mailbox is a connection's bounded queue of deliveries. Producers (the hub's
// dispatcher and the connection's reader, for replies) never block: push fails
// when the mailbox is over either bound and the connection is then closed as a
// slow consumer. The connection's writer takes everything queued at once.
//
// Items are 16 bytes and point at shared events, so a full default mailbox
// (4096 items) costs 64 KiB of slice plus the events everyone shares. The
// backing slices are recycled between push and take (double buffering), and
// dropped when a connection goes idle, so an idle connection holds none.
type mailbox struct {
	maxItems int // static after newMailbox
	maxBytes int // static after newMailbox

	mu     sync.Mutex
	items  []item // guarded by mu
	bytes  int    // guarded by mu
	closed bool   // guarded by mu
}

// push queues it. It reports whether the mailbox was empty, in which case the
// caller must wake the writer (possibly later, once per batch), and whether
// it is now over half of either bound. It returns ErrMailboxFull when the
// mailbox is over a bound or closed.
func (m *mailbox) push(it item) (wasEmpty, pressured bool, err error) {
	n := it.size()
	m.mu.Lock()
	if m.closed || len(m.items) >= m.maxItems || m.bytes+n > m.maxBytes {
		m.mu.Unlock()
		return false, false, ErrMailboxFull
	}
	wasEmpty = len(m.items) == 0
	m.items = append(m.items, it)
	m.bytes += n
	pressured = 2*len(m.items) > m.maxItems || 2*m.bytes > m.maxBytes
	m.mu.Unlock()
	return wasEmpty, pressured, nil
}

// pushControl queues a reply. Replies may exceed the byte bound (they are
// tiny and rare) but not the item bound or a closed mailbox.
func (m *mailbox) pushControl(it item) (wasEmpty bool, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed || len(m.items) >= m.maxItems {
		return false, ErrMailboxFull
	}
	wasEmpty = len(m.items) == 0
	m.items = append(m.items, it)
	m.bytes += it.size()
	return wasEmpty, nil
}

// overHalf reports whether the mailbox is over half of either bound.
func (m *mailbox) overHalf() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return 2*len(m.items) > m.maxItems || 2*m.bytes > m.maxBytes
}

// take returns everything queued and leaves spare (emptied) in its place.
func (m *mailbox) take(spare []item) []item {
	m.mu.Lock()
	items := m.items
	m.items = spare[:0]
	m.bytes = 0
	m.mu.Unlock()
	return items
}

// close refuses every later push and drops what is queued.
func (m *mailbox) close() {
	m.mu.Lock()
	m.closed = true
	m.items = nil
	m.bytes = 0
	m.mu.Unlock()
}

// len is the number of queued items (for tests and metrics).
func (m *mailbox) len() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.items)
}
