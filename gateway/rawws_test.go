package gateway_test

import (
	"bufio"
	"bytes"
	crand "crypto/rand"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// RFC 6455 framing, client side: enough to misbehave in ways a WebSocket
// library won't.
const (
	opContinuation = 0x0
	opText         = 0x1
	opBinary       = 0x2
	opClose        = 0x8
	opPing         = 0x9
	opPong         = 0xa
)

// rawWS is a client connection upgraded by hand. Its reads and writes are
// each used by one goroutine at a time.
type rawWS struct {
	c  net.Conn
	br *bufio.Reader
	wm sync.Mutex // frames are written whole (a pong from the reader beside a test's writes)
}

// upgradeRaw dials the gateway and upgrades /ws. rcvbuf > 0 sets a small
// socket receive buffer, so that a client that stops reading backs up fast.
func upgradeRaw(t *testing.T, e *env, rcvbuf int) *rawWS {
	t.Helper()
	return upgradeRawTo(t, e, "/ws", "", rcvbuf)
}

// upgradeRawTo is upgradeRaw on path, offering subprotocol (if not "").
func upgradeRawTo(t *testing.T, e *env, path, subprotocol string, rcvbuf int) *rawWS {
	t.Helper()
	d := net.Dialer{Timeout: 5 * time.Second}
	if rcvbuf > 0 {
		d.Control = func(_, _ string, rc syscall.RawConn) error {
			var serr error
			if err := rc.Control(func(fd uintptr) {
				serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, rcvbuf)
			}); err != nil {
				return err
			}
			return serr
		}
	}
	addr := e.http.Listener.Addr().String()
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	var key [16]byte
	_, _ = crand.Read(key[:])
	req := "GET " + path + " HTTP/1.1\r\nHost: " + addr + "\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n" +
		"Sec-WebSocket-Key: " + base64.StdEncoding.EncodeToString(key[:]) + "\r\nSec-WebSocket-Version: 13\r\n"
	if subprotocol != "" {
		req += "Sec-WebSocket-Protocol: " + subprotocol + "\r\n"
	}
	req += "\r\n"
	if _, err := io.WriteString(c, req); err != nil {
		c.Close()
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		c.Close()
		t.Fatalf("upgrade: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusSwitchingProtocols {
		c.Close()
		t.Fatalf("upgrade: %s", resp.Status)
	}
	_ = c.SetReadDeadline(time.Time{})
	return &rawWS{c: c, br: br}
}

func (w *rawWS) Close() error { return w.c.Close() }

// appendFrame appends one masked client frame to b.
func (w *rawWS) appendFrame(b *bytes.Buffer, fin bool, op byte, payload []byte) {
	b0 := op
	if fin {
		b0 |= 0x80
	}
	b.WriteByte(b0)
	switch n := len(payload); {
	case n < 126:
		b.WriteByte(0x80 | byte(n))
	case n <= 0xffff:
		b.WriteByte(0x80 | 126)
		_ = binary.Write(b, binary.BigEndian, uint16(n))
	default:
		b.WriteByte(0x80 | 127)
		_ = binary.Write(b, binary.BigEndian, uint64(n))
	}
	var mask [4]byte
	_, _ = crand.Read(mask[:])
	b.Write(mask[:])
	start := b.Len()
	b.Write(payload)
	masked := b.Bytes()[start:]
	for i := range masked {
		masked[i] ^= mask[i%4]
	}
}

func (w *rawWS) writeFrame(fin bool, op byte, payload []byte) error {
	var b bytes.Buffer
	w.appendFrame(&b, fin, op, payload)
	w.wm.Lock()
	defer w.wm.Unlock()
	_, err := w.c.Write(b.Bytes())
	return err
}

// send writes one unfragmented message.
func (w *rawWS) send(t *testing.T, typ websocket.MessageType, msg string) {
	t.Helper()
	op := byte(opText)
	if typ == websocket.MessageBinary {
		op = opBinary
	}
	if err := w.writeFrame(true, op, []byte(msg)); err != nil {
		t.Fatal(err)
	}
}

// readFrame reads one server frame (servers don't mask, nor fragment here).
func (w *rawWS) readFrame() (op byte, payload []byte, err error) {
	var h [2]byte
	if _, err := io.ReadFull(w.br, h[:]); err != nil {
		return 0, nil, err
	}
	n := uint64(h[1] & 0x7f)
	switch n {
	case 126:
		var ext [2]byte
		if _, err := io.ReadFull(w.br, ext[:]); err != nil {
			return 0, nil, err
		}
		n = uint64(binary.BigEndian.Uint16(ext[:]))
	case 127:
		var ext [8]byte
		if _, err := io.ReadFull(w.br, ext[:]); err != nil {
			return 0, nil, err
		}
		n = binary.BigEndian.Uint64(ext[:])
	}
	if h[1]&0x80 != 0 || h[0]&0x80 == 0 || n > 64<<20 {
		return 0, nil, fmt.Errorf("unexpected server frame header %x, length %d", h, n)
	}
	payload = make([]byte, n)
	if _, err := io.ReadFull(w.br, payload); err != nil {
		return 0, nil, err
	}
	return h[0] & 0x0f, payload, nil
}

// next returns the next server message (a text frame's lines one by one
// are the caller's business) or close frame, answering pings on the way.
func (w *rawWS) next() (op byte, payload []byte, err error) {
	for {
		op, payload, err = w.readFrame()
		if err != nil || op != opPing {
			return op, payload, err
		}
		if err := w.writeFrame(true, opPong, payload); err != nil {
			return 0, nil, err
		}
	}
}

// expectText reads the next text frame and checks that it starts with
// prefix (the ready message, if still unread, is skipped).
func (w *rawWS) expectText(t *testing.T, prefix string) {
	t.Helper()
	_ = w.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	defer w.c.SetReadDeadline(time.Time{})
	for {
		op, p, err := w.next()
		if err != nil {
			t.Fatalf("waiting for %s: %v", prefix, err)
		}
		if op != opText {
			t.Fatalf("waiting for %s: got opcode %d %q", prefix, op, p)
		}
		for line := range strings.SplitSeq(string(p), "\n") {
			if strings.HasPrefix(line, prefix) {
				return
			}
			if !strings.HasPrefix(line, `{"type":"ready"`) {
				t.Fatalf("waiting for %s: got %s", prefix, line)
			}
		}
	}
}

// closeCode reads until the server's close frame, answers it, and returns
// its code and the text messages (lines) before it.
func (w *rawWS) closeCode(t *testing.T, d time.Duration) (websocket.StatusCode, []string) {
	t.Helper()
	_ = w.c.SetReadDeadline(time.Now().Add(d))
	var texts []string
	for {
		op, p, err := w.next()
		if err != nil {
			t.Fatalf("waiting for a close frame: %v (after %d messages)", err, len(texts))
		}
		switch op {
		case opText:
			for line := range strings.SplitSeq(string(p), "\n") {
				if !strings.HasPrefix(line, `{"type":"ready"`) {
					texts = append(texts, line)
				}
			}
		case opClose:
			if len(p) < 2 {
				t.Fatalf("close frame without a code: %q", p)
			}
			_ = w.writeFrame(true, opClose, p[:2])
			return websocket.StatusCode(binary.BigEndian.Uint16(p)), texts
		}
	}
}

// closeNormally does the close handshake from the client side.
func (w *rawWS) closeNormally(t *testing.T) {
	t.Helper()
	if err := w.writeFrame(true, opClose, []byte{0x03, 0xe8}); err != nil { // 1000
		t.Fatal(err)
	}
	_ = w.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	for {
		op, _, err := w.next()
		if err != nil {
			t.Fatalf("waiting for the server's close: %v", err)
		}
		if op == opClose {
			w.c.Close()
			return
		}
	}
}
