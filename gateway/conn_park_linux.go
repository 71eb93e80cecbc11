//go:build linux

package gateway

import "syscall"

// skimPongs takes whole pong frames off the front of a woken reader's
// socket, hands each to onPong, and reports whether the socket is empty
// afterwards (the reader may park again). Anything else (a data or close
// frame, a ping, a frame not all there yet, an EOF) is left for the
// library, whose reader is empty (parking checked), so the stream stays
// whole: only complete frames are taken, at a frame boundary.
func (c *conn) skimPongs() bool {
	var peek, got [2 + 4 + 125]byte // a pong's header, mask key and largest payload
	for {
		n, err := c.recv(peek[:], syscall.MSG_PEEK)
		if err == syscall.EAGAIN {
			return true // nothing there (any more)
		}
		if err != nil || n < 2 {
			return false // EOF, an error, or a header still arriving: the library's
		}
		b0, b1 := peek[0], peek[1]
		plen := int(b1 & 0x7f)
		// FIN, no RSV bits, opcode pong; masked (a client's), a short payload.
		if b0 != 0x8a || b1&0x80 == 0 || plen > 125 || n < 6+plen {
			return false
		}
		flen := 6 + plen
		m, err := c.recv(got[:flen], 0)
		if err != nil || m != flen || string(got[:flen]) != string(peek[:flen]) {
			// Someone else read the socket meanwhile (a close handshake):
			// the stream is no longer whole.
			c.closeNow()
			return false
		}
		key, payload := got[2:6], got[6:flen]
		for i := range payload {
			payload[i] ^= key[i&3]
		}
		c.onPong(payload)
	}
}

// recv reads from the socket without waiting (MSG_DONTWAIT), with flags.
func (c *conn) recv(p []byte, flags int) (n int, err error) {
	if cerr := c.park.place.RC.Read(func(fd uintptr) bool {
		n, _, err = syscall.Recvfrom(int(fd), p, flags|syscall.MSG_DONTWAIT)
		return true // never wait
	}); cerr != nil {
		return 0, cerr
	}
	return n, err
}
