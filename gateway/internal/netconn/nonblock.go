package netconn

import (
	"errors"
	"syscall"
)

// Non-blocking batches: how a shared flusher (package flush) writes a
// connection's frames without ever waiting for its socket. Go's sockets are
// non-blocking underneath; syscall.RawConn.Write with a function that never
// asks to wait gets EAGAIN instead of parking. Whatever the socket did not
// take stays in the batch buffer as pending bytes, which go out (blocking,
// on the connection's own writer) before anything else reaches the socket:
// the library's frames (Write) and every later batch first flush them.
// crypto/tls has no such write: TLS connections keep their writer
// goroutine.

// initRaw binds the socket for non-blocking writes when it has a file
// descriptor (plain TCP); under TLS raw stays nil.
func (w *FrameWriter) initRaw() {
	sc, ok := w.c.(syscall.Conn)
	if !ok {
		return
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return
	}
	w.raw, w.rawFn = rc, w.rawWrite
}

// NonBlocking reports whether the socket can be written without blocking.
func (w *FrameWriter) NonBlocking() bool { return w.raw != nil }

// TryBeginBatch is BeginBatch for a flusher, which must never wait: it
// reports false (and takes nothing) while another goroutine writes (a
// library frame on its way out), a library frame is partway through, a
// close frame went out or bytes are pending. The caller then hands the
// connection to its own writer. Between it and EndBatchNB, append with
// AppendHeader and to w.out, and call TryFlush.
func (w *FrameWriter) TryBeginBatch() bool {
	if !w.mu.TryLock() {
		return false
	}
	if w.close || w.need != 0 || w.nh != 0 || w.pending {
		w.mu.Unlock()
		return false
	}
	w.outp = batchBufPool.Get().(*[]byte)
	w.Out, w.err, w.sent, w.blocked = (*w.outp)[:0], nil, 0, false
	return true
}

// TryFlush writes what the batch holds, without waiting. Once the socket
// would block it tries no more: the rest stays in w.out for EndBatchNB. It
// returns the batch's first write error.
func (w *FrameWriter) TryFlush() error {
	if w.err != nil || w.blocked || w.sent == len(w.Out) {
		return w.err
	}
	n, err := w.writeNB(w.Out[w.sent:])
	w.sent += n
	switch {
	case err != nil:
		w.err = err
	case w.sent < len(w.Out):
		w.blocked = true
	default:
		w.Out, w.sent = w.Out[:0], 0
	}
	return w.err
}

// EndBatchNB ends a flusher's batch: it tries to write the rest, then
// releases the writer. pending reports bytes the socket did not take: they
// stay held (w.pending) until FlushPending, or the next library frame or
// batch, writes them.
func (w *FrameWriter) EndBatchNB() (pending bool, err error) {
	err = w.TryFlush()
	if err == nil && w.blocked {
		w.pending, w.blocked = true, false
		w.mu.Unlock()
		return true, nil
	}
	w.putOut()
	w.mu.Unlock()
	return false, err
}

// FlushPending writes the pending bytes, waiting as long as the socket
// takes (a stuck peer is cut by CloseNow, which ends the write).
func (w *FrameWriter) FlushPending() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.flushPendingLocked()
}

// flushPendingLocked is FlushPending with w.mu held.
func (w *FrameWriter) flushPendingLocked() error {
	if !w.pending {
		return nil
	}
	_, err := w.c.Write(w.Out[w.sent:])
	w.pending = false
	w.putOut()
	return err
}

// writeNB writes what of p the socket takes now. A socket that takes
// nothing is no error: n is 0.
func (w *FrameWriter) writeNB(p []byte) (n int, err error) {
	w.rawP, w.rawN, w.rawErr = p, 0, nil
	if err := w.raw.Write(w.rawFn); err != nil { // the connection is closed
		w.rawP = nil
		return 0, err
	}
	n, err = w.rawN, w.rawErr
	w.rawP, w.rawErr = nil, nil
	return n, err
}

// rawWrite is the function raw.Write runs with the descriptor: one write
// (again after EINTR), and never a wait (it always returns true).
func (w *FrameWriter) rawWrite(fd uintptr) bool {
	for {
		n, err := syscall.Write(int(fd), w.rawP)
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		if n > 0 {
			w.rawN = n
		}
		if err != nil && !errors.Is(err, syscall.EAGAIN) {
			w.rawErr = err
		}
		return true
	}
}
