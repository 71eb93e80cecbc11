package loadtest

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/sha1"
	"crypto/tls"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/bits"
	randv2 "math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"
)

// wsConn is the client side of an RFC 6455 WebSocket, just what the GraphQL
// clients need: they receive one event per message, so the per-message
// cost of a general library (coder/websocket's read lock is a three-way
// channel select, plus deadline set-up, per message) dominated what the
// load generator measured. A message is read straight from one bufio.Reader
// into a buffer that is reused, so a steady-state read costs one
// uncontended mutex, the header parse and a copy, and allocates nothing.
//
// One goroutine reads (ReadMessage, or ReadContext during a handshake);
// any goroutine may write or close. The reader answers pings and the
// server's close itself. No extension is negotiated (no compression).
type wsConn struct {
	nc    net.Conn
	br    *bufio.Reader // the whole connection's input, from the upgrade response on; reads through in
	in    stampedReader // notes when the last socket read returned
	limit uint64        // the largest message accepted, in bytes

	// rmu is held by a read in progress: ReadMessage's, or Close's when
	// nobody else is reading and it waits for the server's close itself.
	rmu sync.Mutex
	msg []byte    // the current message; reused by the next read
	ctl [125]byte // the current control frame's payload

	wmu       sync.Mutex
	wbuf      []byte // the frame being written; reused
	closeSent bool   // a close frame has been written: nothing more may be

	closeRead chan struct{} // closed once the server's close frame has been read
	closeOnce sync.Once
}

const (
	wsReadBufSize  = 64 << 10        // the connection's read buffer: many small messages per read syscall
	wsCloseTimeout = 5 * time.Second // how long Close waits for the server's close frame at most
	wsWriteTimeout = 5 * time.Second // bounds a write that has no context (a pong, the answer to a close)
	wsGUID         = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
)

// Opcodes (RFC 6455 section 5.2).
const (
	opContinuation = 0x0
	opText         = 0x1
	opBinary       = 0x2
	opClose        = 0x8
	opPing         = 0x9
	opPong         = 0xA
)

// Close codes the client sends itself (RFC 6455 section 7.4.1).
const (
	closeNormal        = 1000
	closeProtocolError = 1002
	closeNoStatus      = 1005 // reported when a close frame has no code; never sent
	closeTooBig        = 1009
)

// wsCloseError is what a read returns when the server closed the
// connection: its close frame's code and reason.
type wsCloseError struct {
	Code   int
	Reason string
}

func (e *wsCloseError) Error() string {
	return fmt.Sprintf("received close frame: status %d, reason %q", e.Code, e.Reason)
}

// errWSProtocol: the server sent something RFC 6455 does not allow. The
// connection is failed: a close frame is sent if possible, then the
// socket closed.
var errWSProtocol = errors.New("websocket protocol error")

// errWSCloseSent: a write after this side's close frame.
var errWSCloseSent = errors.New("websocket: close frame already sent")

// aLongTimeAgo is a deadline in the past: setting it unblocks I/O at once.
var aLongTimeAgo = time.Unix(1, 0)

// wsDial opens a WebSocket to rawURL (ws, wss, http or https) over d,
// offering subprotocol, which the server must choose. The TCP (and TLS)
// connection and the upgrade are bounded by ctx.
func wsDial(ctx context.Context, d *net.Dialer, rawURL, subprotocol string) (wc *wsConn, err error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, err
	}
	secure := false
	switch u.Scheme {
	case "ws", "http":
	case "wss", "https":
		secure = true
	default:
		return nil, fmt.Errorf("url %s: scheme %q: want ws or wss", rawURL, u.Scheme)
	}
	addr := u.Host
	if u.Port() == "" {
		port := "80"
		if secure {
			port = "443"
		}
		addr = net.JoinHostPort(u.Hostname(), port)
	}
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			_ = nc.Close()
		}
	}()
	if secure {
		tc := tls.Client(nc, &tls.Config{ServerName: u.Hostname()})
		if err := tc.HandshakeContext(ctx); err != nil {
			return nil, err
		}
		nc = tc
	}
	// The upgrade's I/O ends with ctx.
	dl, _ := ctx.Deadline()
	_ = nc.SetDeadline(dl)
	stop := context.AfterFunc(ctx, func() { _ = nc.SetDeadline(aLongTimeAgo) })
	defer func() {
		if !stop() && err == nil {
			wc, err = nil, ctx.Err() // the deadline would cut the first read
		}
		_ = nc.SetDeadline(time.Time{})
	}()

	var nonce [16]byte
	_, _ = rand.Read(nonce[:]) // never fails
	key := base64.StdEncoding.EncodeToString(nonce[:])
	var req strings.Builder
	fmt.Fprintf(&req, "GET %s HTTP/1.1\r\nHost: %s\r\n", u.RequestURI(), u.Host)
	fmt.Fprintf(&req, "Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: %s\r\n", key)
	if subprotocol != "" {
		fmt.Fprintf(&req, "Sec-WebSocket-Protocol: %s\r\n", subprotocol)
	}
	req.WriteString("\r\n")
	if _, err := io.WriteString(nc, req.String()); err != nil {
		return nil, fmt.Errorf("upgrade request: %w", err)
	}

	// The reader is the connection's for good: whatever the server sent
	// after its response's headers stays buffered for the first read.
	wc = &wsConn{nc: nc, in: stampedReader{r: nc}, limit: readLimit, closeRead: make(chan struct{})}
	wc.br = bufio.NewReaderSize(&wc.in, wsReadBufSize)
	resp, err := http.ReadResponse(wc.br, &http.Request{Method: http.MethodGet})
	if err != nil {
		return nil, fmt.Errorf("upgrade response: %w", err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 200))
		return nil, fmt.Errorf("upgrade: the server answered %s, want 101 Switching Protocols: %q", resp.Status, body)
	}
	if !strings.EqualFold(resp.Header.Get("Upgrade"), "websocket") || !headerHasToken(resp.Header, "Connection", "upgrade") {
		return nil, fmt.Errorf("upgrade: 101 without Upgrade: websocket and Connection: Upgrade")
	}
	if got, want := resp.Header.Get("Sec-WebSocket-Accept"), wsAccept(key); got != want {
		return nil, fmt.Errorf("upgrade: Sec-WebSocket-Accept %q, want %q", got, want)
	}
	if got := resp.Header.Get("Sec-WebSocket-Protocol"); got != subprotocol {
		return nil, fmt.Errorf("%w: the server chose subprotocol %q, want %q", ErrProtocol, got, subprotocol)
	}
	if ext := resp.Header.Get("Sec-WebSocket-Extensions"); ext != "" {
		return nil, fmt.Errorf("%w: the server chose extensions %q; none were offered", ErrProtocol, ext)
	}
	return wc, nil
}

// stampedReader notes when each read that returned data did, so that a
// message's receive time costs one clock read per socket read (a 64 KiB
// read holds about 150 GraphQL events), not one per message.
type stampedReader struct {
	r  io.Reader
	at int64 // unix ns
}

func (s *stampedReader) Read(p []byte) (int, error) {
	n, err := s.r.Read(p)
	if n > 0 {
		s.at = time.Now().UnixNano()
	}
	return n, err
}

// wsAccept is the Sec-WebSocket-Accept a server must answer key with.
func wsAccept(key string) string {
	h := sha1.Sum([]byte(key + wsGUID))
	return base64.StdEncoding.EncodeToString(h[:])
}

// headerHasToken reports whether one of h's comma-separated name values
// is token, case-insensitively.
func headerHasToken(h http.Header, name, token string) bool {
	for _, v := range h.Values(name) {
		for t := range strings.SplitSeq(v, ",") {
			if strings.EqualFold(strings.TrimSpace(t), token) {
				return true
			}
		}
	}
	return false
}

// wsHeader is one frame's header.
type wsHeader struct {
	fin    bool
	op     byte
	length uint64
}

// ReadMessage reads the next text or binary message, reassembling
// fragments and answering control frames that come before or between
// them. The message stays valid until the next read. at is its receive
// time (unix ns): when the socket read that completed it returned. The server's close
// frame is answered and returned as a *wsCloseError; a frame the protocol
// forbids fails the connection with errWSProtocol. It blocks until a
// message arrives or the connection fails or is closed (CloseNow unblocks
// it).
func (c *wsConn) ReadMessage() (msg []byte, at int64, err error) {
	c.rmu.Lock()
	defer c.rmu.Unlock()
	msg, err = c.readMessage()
	return msg, c.in.at, err
}

// ReadContext is ReadMessage bounded by ctx, for handshakes: it costs a
// timer, so the data path reads with ReadMessage and closes the connection
// to stop a read.
func (c *wsConn) ReadContext(ctx context.Context) ([]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	dl, _ := ctx.Deadline()
	_ = c.nc.SetReadDeadline(dl)
	stop := context.AfterFunc(ctx, func() { _ = c.nc.SetReadDeadline(aLongTimeAgo) })
	msg, _, err := c.ReadMessage()
	if !stop() || (err != nil && ctx.Err() != nil) {
		// The deadline (or ctx's end) cut the read, or will cut the next:
		// the connection is not to be used on.
		if err == nil {
			return nil, ctx.Err()
		}
		return nil, fmt.Errorf("%w (%v)", ctx.Err(), err)
	}
	_ = c.nc.SetReadDeadline(time.Time{})
	return msg, err
}

// readMessage is ReadMessage with rmu held.
func (c *wsConn) readMessage() ([]byte, error) {
	msg := c.msg[:0]
	started := false // a first fragment has been read
	for {
		h, err := c.readHeader()
		if err != nil {
			return nil, err
		}
		switch h.op {
		case opClose, opPing, opPong:
			if err := c.control(h); err != nil {
				return nil, err
			}
			continue
		case opText, opBinary:
			if started {
				return nil, c.fail(closeProtocolError, "a new message (opcode %d) inside a fragmented one", h.op)
			}
			started = true
		case opContinuation:
			if !started {
				return nil, c.fail(closeProtocolError, "a continuation frame with no message to continue")
			}
		}
		if h.length > c.limit-uint64(len(msg)) {
			return nil, c.fail(closeTooBig, "a message of more than %d bytes (frame length %d after %d bytes)", c.limit, h.length, len(msg))
		}
		n := int(h.length)
		msg = slices.Grow(msg, n) // allocates only for a message bigger than any before
		msg = msg[:len(msg)+n]
		_, err = io.ReadFull(c.br, msg[len(msg)-n:])
		c.msg = msg[:0] // keep the capacity
		if err != nil {
			return nil, noEOF(err)
		}
		if h.fin {
			return msg, nil
		}
	}
}

// readHeader reads and checks one frame header (2 to 10 bytes: server
// frames carry no mask).
func (c *wsConn) readHeader() (wsHeader, error) {
	b, err := c.br.Peek(2)
	if err != nil {
		if len(b) > 0 {
			err = noEOF(err)
		}
		return wsHeader{}, err
	}
	h := wsHeader{fin: b[0]&0x80 != 0, op: b[0] & 0x0f, length: uint64(b[1] & 0x7f)}
	if rsv := b[0] & 0x70; rsv != 0 {
		return h, c.fail(closeProtocolError, "reserved bits 0x%02x set, and no extension was negotiated", rsv)
	}
	if b[1]&0x80 != 0 {
		return h, c.fail(closeProtocolError, "a masked frame from the server")
	}
	switch h.op {
	case opContinuation, opText, opBinary:
	case opClose, opPing, opPong:
		if !h.fin {
			return h, c.fail(closeProtocolError, "a fragmented control frame (opcode 0x%x)", h.op)
		}
		if h.length > 125 {
			return h, c.fail(closeProtocolError, "a control frame (opcode 0x%x) of %d bytes: at most 125", h.op, h.length)
		}
	default:
		return h, c.fail(closeProtocolError, "unknown opcode 0x%x", h.op)
	}
	n := 2
	switch h.length {
	case 126:
		n += 2
	case 127:
		n += 8
	}
	if n > 2 {
		if b, err = c.br.Peek(n); err != nil {
			return h, noEOF(err)
		}
		if n == 4 {
			h.length = uint64(binary.BigEndian.Uint16(b[2:]))
		} else {
			h.length = binary.BigEndian.Uint64(b[2:])
			if h.length>>63 != 0 {
				return h, c.fail(closeProtocolError, "a 64-bit length with its most significant bit set")
			}
		}
	}
	_, _ = c.br.Discard(n) // Peek has buffered them
	return h, nil
}

// control reads the payload of a control frame and acts on it.
func (c *wsConn) control(h wsHeader) error {
	p := c.ctl[:h.length]
	if _, err := io.ReadFull(c.br, p); err != nil {
		return noEOF(err)
	}
	switch h.op {
	case opPing:
		if err := c.writeFrame(time.Now().Add(wsWriteTimeout), opPong, p); err != nil && !errors.Is(err, errWSCloseSent) {
			return fmt.Errorf("pong: %w", err)
		}
	case opClose:
		ce := &wsCloseError{Code: closeNoStatus}
		switch {
		case len(p) == 1:
			return c.fail(closeProtocolError, "a close frame with a 1-byte payload")
		case len(p) >= 2:
			ce.Code, ce.Reason = int(binary.BigEndian.Uint16(p)), string(p[2:])
		}
		c.closeOnce.Do(func() { close(c.closeRead) })
		// Answer it, echoing the code, unless this side has closed
		// already (then Close is waiting for just this frame).
		var echo []byte
		if ce.Code != closeNoStatus {
			echo = p[:2]
		}
		if err := c.writeFrame(time.Now().Add(wsWriteTimeout), opClose, echo); err != nil && !errors.Is(err, errWSCloseSent) {
			return errors.Join(ce, fmt.Errorf("answer close: %w", err))
		}
		return ce
	}
	return nil // a pong: ours are not sent, so nothing waits for one
}

// fail fails the connection on a protocol violation: it sends a close
// frame with code (if it still can, briefly) and closes the socket.
func (c *wsConn) fail(code int, format string, args ...any) error {
	err := fmt.Errorf("%w: %s", errWSProtocol, fmt.Sprintf(format, args...))
	_ = c.writeFrame(time.Now().Add(time.Second), opClose, closePayload(code, ""))
	_ = c.nc.Close()
	return err
}

// noEOF turns an io.EOF inside a frame into io.ErrUnexpectedEOF.
func noEOF(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}

// WriteText sends p as one masked text frame, bounded by ctx's deadline
// (or wsWriteTimeout).
func (c *wsConn) WriteText(ctx context.Context, p []byte) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	dl, ok := ctx.Deadline()
	if !ok {
		dl = time.Now().Add(wsWriteTimeout)
	}
	return c.writeFrame(dl, opText, p)
}

// writeFrame writes one unfragmented frame, masked with a fresh key, in
// one write, and gives up at deadline. After a close frame it writes
// nothing more (errWSCloseSent).
func (c *wsConn) writeFrame(deadline time.Time, op byte, p []byte) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.closeSent {
		return errWSCloseSent
	}
	if op == opClose {
		c.closeSent = true
	}
	b := append(c.wbuf[:0], 0x80|op)
	switch n := len(p); {
	case n <= 125:
		b = append(b, 0x80|byte(n))
	case n <= 0xffff:
		b = append(b, 0x80|126)
		b = binary.BigEndian.AppendUint16(b, uint16(n))
	default:
		b = append(b, 0x80|127)
		b = binary.BigEndian.AppendUint64(b, uint64(n))
	}
	// Masking keeps intermediaries from taking frames for other protocols'
	// requests; it needs unpredictability, not cryptographic strength.
	key := randv2.Uint32()
	b = binary.LittleEndian.AppendUint32(b, key)
	start := len(b)
	b = append(b, p...)
	maskBytes(b[start:], key)
	c.wbuf = b
	_ = c.nc.SetWriteDeadline(deadline)
	_, err := c.nc.Write(b)
	return err
}

// maskBytes XORs p with the mask key (its 4 bytes in little-endian order,
// as they are on the wire), 8 bytes at a time.
func maskBytes(p []byte, key uint32) {
	k8 := uint64(key) | uint64(key)<<32
	for len(p) >= 8 {
		binary.LittleEndian.PutUint64(p, binary.LittleEndian.Uint64(p)^k8)
		p = p[8:]
	}
	for i := range p {
		p[i] ^= byte(key)
		key = bits.RotateLeft32(key, -8)
	}
}

// closePayload is a close frame's payload: code, then reason, cut to fit
// in a control frame.
func closePayload(code int, reason string) []byte {
	if len(reason) > 123 {
		reason = reason[:123]
	}
	return append(binary.BigEndian.AppendUint16(nil, uint16(code)), reason...)
}

// Close sends a close frame with code and reason, waits for the server's
// close frame (at most wsCloseTimeout, and not past ctx), then closes the
// socket. If a reader is reading, it sees the server's close; otherwise
// Close reads, discarding messages, until it arrives (a reader that calls
// ReadMessage meanwhile waits, then fails on the closed socket).
func (c *wsConn) Close(ctx context.Context, code int, reason string) error {
	defer c.nc.Close()
	select {
	case <-c.closeRead:
		return nil // the server closed first and the reader has answered
	default:
	}
	deadline := time.Now().Add(wsCloseTimeout)
	if dl, ok := ctx.Deadline(); ok && dl.Before(deadline) {
		deadline = dl
	}
	if err := c.writeFrame(deadline, opClose, closePayload(code, reason)); err != nil {
		if errors.Is(err, errWSCloseSent) {
			return nil
		}
		return fmt.Errorf("close: %w", err)
	}
	if c.rmu.TryLock() {
		defer c.rmu.Unlock()
		select {
		case <-c.closeRead:
			// A reader read the server's close after the check above and
			// is done: there is nothing left to wait for.
			return nil
		default:
		}
		_ = c.nc.SetReadDeadline(deadline)
		stop := context.AfterFunc(ctx, func() { _ = c.nc.SetReadDeadline(aLongTimeAgo) })
		defer stop()
		c.discardUntilClose()
		return nil
	}
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case <-c.closeRead:
	case <-ctx.Done():
	case <-t.C:
	}
	return nil
}

// discardUntilClose reads frames, with rmu held, until the server's close
// frame or an error. Data is skipped, not read into c.msg: the reader may
// still be working on the message it returned last.
func (c *wsConn) discardUntilClose() {
	for {
		h, err := c.readHeader()
		if err != nil {
			return
		}
		if h.op >= opClose {
			if err := c.control(h); err != nil {
				return // the server's close, or a failure
			}
			continue
		}
		if h.length > c.limit {
			return
		}
		if _, err := c.br.Discard(int(h.length)); err != nil {
			return
		}
	}
}

// CloseNow closes the socket without a close handshake. A read in
// progress fails.
func (c *wsConn) CloseNow() error {
	return c.nc.Close()
}

// CloseNormal closes with a normal-closure handshake bounded by ctx and
// wsCloseTimeout (wireConn).
func (c *wsConn) CloseNormal(ctx context.Context) {
	_ = c.Close(ctx, closeNormal, "loadtest done")
}
