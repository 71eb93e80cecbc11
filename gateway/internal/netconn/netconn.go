package netconn

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"io"
	"math"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// connReadBuffer is the size of the reader the library reads from,
// instead of net/http's 4 KiB: clients send little, and an idle
// connection should hold as little as possible.
const connReadBuffer = 512

// HijackWriter wraps the handler's ResponseWriter for websocket.Accept. FW
// (if not nil) receives the connection's FrameWriter.
type HijackWriter struct {
	http.ResponseWriter
	FW **FrameWriter
	BR **bufio.Reader // if not nil, receives the reader the library reads from (parking checks it is empty)
	NC *net.Conn      // if not nil, receives the hijacked connection
	// if not nil, receives the connection the library reads after the
	// bytes that came with the upgrade request; stays nil if none did
	Prefix **PrefixConn
}

// PrefixConn is the hijacked connection of an upgrade request that came
// with frames behind it: it tells when the library has read past them.
type PrefixConn struct {
	net.Conn
	Reached atomic.Bool // the library has read from the connection: the bytes before it are consumed
}

func (p *PrefixConn) Read(b []byte) (int, error) {
	p.Reached.Store(true)
	return p.Conn.Read(b)
}

func (w HijackWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (w HijackWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	nc, brw, err := http.NewResponseController(w.ResponseWriter).Hijack()
	if err != nil {
		return nil, nil, err
	}
	// An upgrade request that came with a body got a read deadline for it
	// (HTTPServer); a WebSocket has none.
	_ = nc.SetReadDeadline(time.Time{})
	// net/http flushed the 101 response before handing us the connection;
	// its reader may already hold the client's first frames (a GraphQL
	// client sends connection_init at once): keep them. They must be
	// buffered in the reader we return, not only in its source: the
	// websocket library keeps what is buffered and resets the reader onto
	// the connection (golang/go#32314), dropping any other source.
	var r io.Reader = nc
	size := connReadBuffer
	n := brw.Reader.Buffered()
	if n > 0 {
		b, _ := brw.Reader.Peek(n)
		r = io.MultiReader(bytes.NewReader(bytes.Clone(b)), nc)
		size = max(size, n)
	}
	br := bufio.NewReaderSize(r, size)
	if n > 0 {
		_, _ = br.Peek(n) // reads only the kept bytes: they come first and fit
	}
	fw := &FrameWriter{c: nc}
	fw.initRaw()
	if n > 0 {
		// The library reads the kept bytes from a reader of its own ahead
		// of the connection (see above), where parking cannot see them:
		// until it reads from the connection itself, they may be there.
		pc := &PrefixConn{Conn: nc}
		if w.Prefix != nil {
			*w.Prefix = pc
		}
		nc = pc
	}
	if w.FW != nil {
		*w.FW = fw
	}
	if w.BR != nil {
		*w.BR = br
	}
	if w.NC != nil {
		*w.NC = nc
	}
	return nc, bufio.NewReadWriter(br, bufio.NewWriterSize(fw, 16)), nil
}

// FrameWriter receives the server's outgoing WebSocket frames as a byte
// stream, in the pieces a 16-byte bufio.Writer produces (a full 16-byte chunk
// holding the header and the payload's first bytes, then the rest in one
// piece), and writes each frame with a single syscall. It parses frame headers
// to know where a frame ends, so it never holds back the end of a frame.
//
// A protocol that needs one WebSocket message per event (GraphQL) frames its
// messages itself, in batches (BeginBatch): the library's per-message cost
// (two channel-based locks, a deferred closure, a 16-byte bufio pass) was
// most of a GraphQL delivery's, and a batch leaves in one write per
// batchLimit instead of one per message. That is safe beside the library's
// own frames (pings, pongs, closes): a batch starts only at a frame boundary
// of the stream that reached the socket, a library frame still in the
// library's buffer reaches the socket whole, after it, and nothing is
// written after a close frame.
type FrameWriter struct {
	mu    sync.Mutex // Write (the library, under its frame lock) and batches (the connection's writer)
	c     net.Conn
	close bool    // guarded by mu: a close frame went out; no data may follow
	Out   []byte  // guarded by mu, held from BeginBatch to EndBatch: the batch's frames
	outp  *[]byte // the pooled buffer out came from
	err   error   // guarded by mu: the batch's first write error

	// Non-blocking batches (nonblock.go), for the flushers.
	raw     syscall.RawConn       // static: the socket; nil when it cannot be written without blocking (TLS)
	rawFn   func(fd uintptr) bool // static: rawWrite, bound once
	rawP    []byte                // guarded by mu: what rawWrite writes
	rawN    int                   // guarded by mu: what it wrote
	rawErr  error                 // guarded by mu: its error (not EAGAIN)
	sent    int                   // guarded by mu, with out: bytes of out already on the socket
	blocked bool                  // guarded by mu, with out: a write would have blocked; nothing more is tried
	pending bool                  // guarded by mu: out[sent:] must reach the socket before anything else

	held [16]byte
	nh   int   // bytes in held
	need int64 // bytes of the current frame not yet received; 0 at a frame boundary
	iov  [2][]byte
	bufs net.Buffers
}

// batchLimit is how much of a batch is written at once.
const batchLimit = 64 << 10

var batchBufPool = sync.Pool{New: func() any { b := make([]byte, 0, batchLimit+4096); return &b }}

// BeginBatch takes the writer for a batch of messages: AppendText adds
// them, EndBatch writes what is left and releases the writer. The library's
// frames wait meanwhile. It reports false (and takes nothing) after a close
// frame, or while a library frame is partway through; the caller then
// writes through the library.
func (w *FrameWriter) BeginBatch() bool {
	w.mu.Lock()
	if w.close || w.need != 0 || w.nh != 0 {
		w.mu.Unlock()
		return false
	}
	perr := w.flushPendingLocked()
	w.outp = batchBufPool.Get().(*[]byte)
	w.Out, w.err = (*w.outp)[:0], perr
	return true
}

// AppendHeader appends the header of an unfragmented text frame with an
// n-byte payload; the caller appends the payload to w.out, then calls
// FlushIfFull. Between BeginBatch and EndBatch only.
func (w *FrameWriter) AppendHeader(n int) {
	h := append(w.Out, 0x81) // FIN, text
	switch {
	case n < 126:
		h = append(h, byte(n))
	case n <= math.MaxUint16:
		h = append(h, 126)
		h = binary.BigEndian.AppendUint16(h, uint16(n))
	default:
		h = append(h, 127)
		h = binary.BigEndian.AppendUint64(h, uint64(n))
	}
	w.Out = h
}

// AppendText appends p as one message. Between BeginBatch and EndBatch only.
func (w *FrameWriter) AppendText(p []byte) error {
	w.AppendHeader(len(p))
	w.Out = append(w.Out, p...)
	return w.FlushIfFull()
}

// FlushIfFull writes the batch so far once it holds batchLimit bytes. It
// returns the batch's first write error.
func (w *FrameWriter) FlushIfFull() error {
	if len(w.Out) >= batchLimit && w.err == nil {
		_, w.err = w.c.Write(w.Out)
		w.Out = w.Out[:0]
	}
	return w.err
}

// EndBatch writes the rest of the batch, releases the writer and returns
// the batch's first write error.
func (w *FrameWriter) EndBatch() error {
	if len(w.Out) > 0 && w.err == nil {
		_, w.err = w.c.Write(w.Out)
	}
	err := w.err
	w.putOut()
	w.mu.Unlock()
	return err
}

// putOut returns the batch buffer; w.mu is held.
func (w *FrameWriter) putOut() {
	if cap(w.Out) <= 2*batchLimit { // else one huge message: let it go
		*w.outp = w.Out[:0]
		batchBufPool.Put(w.outp)
	}
	w.Out, w.outp, w.err = nil, nil, nil
	w.sent, w.blocked = 0, false
}

// WritePing writes a ping frame with payload (at most 125 bytes) between
// the library's frames. It reports false, writing nothing, after a close
// frame or while a library frame is partway through.
func (w *FrameWriter) WritePing(payload []byte) (bool, error) {
	if !w.BeginBatch() {
		return false, nil
	}
	w.Out = append(w.Out, 0x89, byte(len(payload))) // FIN, ping
	w.Out = append(w.Out, payload...)
	return true, w.EndBatch()
}

func (w *FrameWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if err := w.flushPendingLocked(); err != nil {
		return 0, err
	}
	total := len(p)
	if w.nh > 0 && w.need == 0 {
		// A partial header is held (never with a 16-byte bufio.Writer, whose
		// first chunk holds any header): join it with p and start over.
		p = append(w.held[:w.nh:w.nh], p...)
		w.nh = 0
	}
	for len(p) > 0 {
		if w.need > 0 { // inside a frame: this piece completes (part of) it
			k := min(int64(len(p)), w.need)
			if err := w.flushHeld(p[:k]); err != nil {
				return 0, err
			}
			w.need -= k
			p = p[k:]
			continue
		}
		flen, ok := frameLen(p)
		if len(p) > 0 && p[0]&0x0f == 0x8 { // a close frame starts
			w.close = true
		}
		switch {
		case !ok: // header incomplete: hold it (len(p) < 14)
			w.nh = copy(w.held[:], p)
			return total, nil
		case flen <= int64(len(p)): // a whole frame
			if _, err := w.c.Write(p[:flen]); err != nil {
				return 0, err
			}
			p = p[flen:]
		case len(p) <= len(w.held): // bufio's first chunk: hold it for the writev
			w.nh = copy(w.held[:], p)
			w.need = flen - int64(len(p))
			return total, nil
		default: // a long partial frame: send it, the rest follows
			if _, err := w.c.Write(p); err != nil {
				return 0, err
			}
			w.need = flen - int64(len(p))
			return total, nil
		}
	}
	return total, nil
}

// flushHeld writes the held bytes followed by p, in one writev when there is
// something held.
func (w *FrameWriter) flushHeld(p []byte) error {
	if w.nh == 0 {
		_, err := w.c.Write(p)
		return err
	}
	w.iov[0], w.iov[1] = w.held[:w.nh], p
	w.bufs = w.iov[:]
	_, err := w.bufs.WriteTo(w.c)
	w.nh = 0
	w.iov[1] = nil
	return err
}

// frameLen returns the total length (header and payload) of the WebSocket
// frame that starts p, or ok=false when p is too short to hold its header.
func frameLen(p []byte) (n int64, ok bool) {
	if len(p) < 2 {
		return 0, false
	}
	hdr := int64(2)
	if p[1]&0x80 != 0 {
		hdr += 4 // mask key; servers don't mask, but be exact
	}
	switch l := p[1] & 0x7f; l {
	case 126:
		if len(p) < 4 {
			return 0, false
		}
		return hdr + 2 + int64(binary.BigEndian.Uint16(p[2:4])), true
	case 127:
		if len(p) < 10 {
			return 0, false
		}
		n := binary.BigEndian.Uint64(p[2:10])
		if n > uint64(math.MaxInt64-hdr-8) { // RFC 6455 forbids the top bit; never let it go negative
			return math.MaxInt64, true
		}
		return hdr + 8 + int64(n), true
	default:
		return hdr + int64(l), true
	}
}
