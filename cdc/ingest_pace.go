package cdc

import (
	"net"
	"syscall"
	"time"
)

// Pacing the reads of a big transaction. The walsender sends a big
// transaction's changes as fast as it decodes them (~3.5 µs each on the
// deployed 100k-row UPDATE), and the reader handles one in ~1 µs, so it
// read each as it came: one read(2) per message, and mostly an EAGAIN, a
// park in the netpoller and a wake-up too. Once changes were held as
// their messages (hold.go), those reads were 37% of the ingest's CPU on
// that UPDATE. None of a transaction's changes is published before its
// commit, so while the one being received is big the reader lets them
// gather in the socket: when pgconn's buffer is (nearly) empty and the
// kernel holds less than a read's worth, it pauses for paceSleep before
// it reads. A small transaction is read as it comes (its latency is the
// point); a big one's commit waits at most paceSleep more, after the
// paceChanges changes that made it big. (Tried instead: the socket's
// SO_RCVLOWAT at 16 KiB with a 2 ms read deadline. A non-blocking read
// still takes whatever little has arrived, so reads stayed small: 3.4
// against 2.9 µs of CPU a change, alternated on the same UPDATE.)
const (
	paceChanges  = 1000                   // changes held by the transaction being received before its reads are paced
	paceBuffered = 512                    // bytes in pgconn's buffer under which a read is near
	paceBytes    = 8 << 10                // bytes waiting in the kernel from which a read is worth it (pgconn's buffer)
	paceSleep    = 500 * time.Microsecond // the pause: ~140 messages at the walsender's pace
)

// pacer asks the kernel how much the replication connection has waiting.
type pacer struct {
	raw   syscall.RawConn // nil: the connection cannot be asked, reads are not paced
	avail int             // set by ask
	ask   func(fd uintptr)
}

func newPacer(nc net.Conn) *pacer {
	if tc, ok := nc.(interface{ NetConn() net.Conn }); ok { // TLS: the socket under it
		nc = tc.NetConn()
	}
	p := &pacer{}
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return p
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return p
	}
	p.raw = raw
	p.ask = func(fd uintptr) { p.avail = socketPending(fd) }
	return p
}

// pending is the bytes the kernel holds unread on the connection (-1:
// unknown).
func (p *pacer) pending() int {
	if p == nil || p.raw == nil {
		return -1
	}
	p.avail = -1
	if err := p.raw.Control(p.ask); err != nil {
		return -1
	}
	return p.avail
}

// pace pauses before the next receive when the transaction being received
// is big and little of it waits to be read (see the top of this file).
func (r *reader) pace() {
	t := r.cur
	if r.inStream {
		t = r.streamed[r.streamXid]
	}
	if t == nil || t.spill == nil && t.changes.len() < paceChanges {
		return
	}
	if r.conn.Frontend().ReadBufferLen() >= paceBuffered {
		return
	}
	if n := r.pacer.pending(); n >= 0 && n < paceBytes {
		time.Sleep(paceSleep)
	}
}
