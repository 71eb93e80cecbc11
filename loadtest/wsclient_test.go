package loadtest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"
)

// wsPeer is the server side of a wsConn under test: a loopback TCP
// connection on which the test writes hand-made frames and reads the
// client's.
type wsPeer struct {
	t  *testing.T
	nc net.Conn
	r  *bufio.Reader
}

// wsTestServer listens on loopback; each accepted connection gets the
// upgrade request read and answered by respond (which gets the request's
// Sec-WebSocket-Key and returns the raw response, including whatever
// follows its headers), then is handed over on the channel.
func wsTestServer(t *testing.T, respond func(key string) string) (string, <-chan *wsPeer) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	peers := make(chan *wsPeer, 1)
	done := make(chan struct{})
	t.Cleanup(func() { _ = ln.Close(); <-done })
	go func() {
		defer close(done)
		defer close(peers)
		nc, err := ln.Accept()
		if err != nil {
			return
		}
		r := bufio.NewReader(nc)
		req, err := http.ReadRequest(r)
		if err != nil {
			_ = nc.Close()
			return
		}
		if _, err := io.WriteString(nc, respond(req.Header.Get("Sec-WebSocket-Key"))); err != nil {
			_ = nc.Close()
			return
		}
		peers <- &wsPeer{t: t, nc: nc, r: r}
	}()
	return "ws://" + ln.Addr().String() + "/graphql", peers
}

// upgradeOK is a correct 101 for key choosing graphql-transport-ws.
func upgradeOK(key string) string {
	return "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n" +
		"Sec-WebSocket-Accept: " + wsAccept(key) + "\r\nSec-WebSocket-Protocol: " + gqlSubprotocol + "\r\n\r\n"
}

// wsTestPair dials a wsConn to a test server that answers with upgradeOK
// followed by extra, and returns both ends, closed when the test ends.
func wsTestPair(t *testing.T, extra []byte) (*wsConn, *wsPeer) {
	t.Helper()
	u, peers := wsTestServer(t, func(key string) string { return upgradeOK(key) + string(extra) })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := wsDial(ctx, &net.Dialer{}, u, gqlSubprotocol)
	if err != nil {
		t.Fatal(err)
	}
	p := <-peers
	if p == nil {
		t.Fatal("the test server failed")
	}
	t.Cleanup(func() { _ = c.CloseNow(); _ = p.nc.Close() })
	return c, p
}

// srvFrame is a server frame: b0 is FIN, RSV and opcode as written;
// mask, when not nil, masks it (which a server must not do).
func srvFrame(b0 byte, payload []byte, mask []byte) []byte {
	b := []byte{b0, 0}
	switch n := len(payload); {
	case n <= 125:
		b[1] = byte(n)
	case n <= 0xffff:
		b[1] = 126
		b = binary.BigEndian.AppendUint16(b, uint16(n))
	default:
		b[1] = 127
		b = binary.BigEndian.AppendUint64(b, uint64(n))
	}
	if mask == nil {
		return append(b, payload...)
	}
	b[1] |= 0x80
	b = append(b, mask...)
	for i, c := range payload {
		b = append(b, c^mask[i%4])
	}
	return b
}

func (p *wsPeer) write(frames ...[]byte) {
	p.t.Helper()
	if _, err := p.nc.Write(bytes.Join(frames, nil)); err != nil {
		p.t.Fatal(err)
	}
}

// readFrame reads one client frame, which must be masked and unfragmented,
// and returns its opcode and unmasked payload.
func (p *wsPeer) readFrame() (op byte, payload []byte) {
	p.t.Helper()
	_ = p.nc.SetReadDeadline(time.Now().Add(5 * time.Second))
	var h [2]byte
	if _, err := io.ReadFull(p.r, h[:]); err != nil {
		p.t.Fatalf("read client frame: %v", err)
	}
	if h[0]&0xf0 != 0x80 || h[1]&0x80 == 0 {
		p.t.Fatalf("client frame header %08b %08b: want FIN, no RSV, masked", h[0], h[1])
	}
	n := uint64(h[1] & 0x7f)
	switch n {
	case 126:
		var b [2]byte
		_, _ = io.ReadFull(p.r, b[:])
		n = uint64(binary.BigEndian.Uint16(b[:]))
	case 127:
		var b [8]byte
		_, _ = io.ReadFull(p.r, b[:])
		n = binary.BigEndian.Uint64(b[:])
	}
	var mask [4]byte
	if _, err := io.ReadFull(p.r, mask[:]); err != nil {
		p.t.Fatal(err)
	}
	payload = make([]byte, n)
	if _, err := io.ReadFull(p.r, payload); err != nil {
		p.t.Fatal(err)
	}
	for i := range payload {
		payload[i] ^= mask[i%4]
	}
	return h[0] & 0x0f, payload
}

// wsCloseCode returns the close code of the server's close frame that err
// carries, or -1 when err did not come from one.
func wsCloseCode(err error) int {
	if ce, ok := errors.AsType[*wsCloseError](err); ok {
		return ce.Code
	}
	return -1
}

func readMsg(t *testing.T, c *wsConn) string {
	t.Helper()
	_ = c.nc.SetReadDeadline(time.Now().Add(5 * time.Second))
	msg, _, err := c.ReadMessage()
	if err != nil {
		t.Fatalf("ReadMessage: %v", err)
	}
	return string(msg)
}

const (
	finText = 0x80 | opText
	finCont = 0x80 | opContinuation
)

// TestWSDial checks the upgrade: bytes the server sent right behind its
// response are kept, and a wrong status, accept key or subprotocol fails.
func TestWSDial(t *testing.T) {
	t.Run("frames behind the response", func(t *testing.T) {
		c, _ := wsTestPair(t, append(srvFrame(finText, []byte(`{"type":"connection_ack"}`), nil), srvFrame(finText, []byte("second"), nil)...))
		if got := readMsg(t, c); got != `{"type":"connection_ack"}` {
			t.Fatalf("first message %q", got)
		}
		if got := readMsg(t, c); got != "second" {
			t.Fatalf("second message %q", got)
		}
	})
	for _, tc := range []struct {
		name, want string
		respond    func(key string) string
	}{
		{"status", "403 Forbidden", func(string) string {
			return "HTTP/1.1 403 Forbidden\r\nContent-Length: 4\r\n\r\nnope"
		}},
		{"accept", "Sec-WebSocket-Accept", func(key string) string {
			return strings.Replace(upgradeOK(key), wsAccept(key), wsAccept("x"+key), 1)
		}},
		{"subprotocol", "subprotocol", func(key string) string {
			return strings.Replace(upgradeOK(key), "Sec-WebSocket-Protocol: "+gqlSubprotocol+"\r\n", "", 1)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u, peers := wsTestServer(t, tc.respond)
			c, err := wsDial(context.Background(), &net.Dialer{}, u, gqlSubprotocol)
			if err == nil {
				_ = c.CloseNow()
				t.Fatal("dial succeeded")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want it to mention %q", err, tc.want)
			}
			if p := <-peers; p != nil {
				_ = p.nc.Close()
			}
		})
	}
}

// TestWSReadFrames drives the frame reader with hand-written frames.
func TestWSReadFrames(t *testing.T) {
	t.Run("lengths", func(t *testing.T) {
		c, p := wsTestPair(t, nil)
		for _, n := range []int{0, 125, 126, 300, 0xffff, 0x10000, 200_000} {
			want := bytes.Repeat([]byte{'a' + byte(n%26)}, n)
			p.write(srvFrame(finText, want, nil))
			if got := readMsg(t, c); got != string(want) {
				t.Fatalf("%d bytes: got %d", n, len(got))
			}
		}
	})
	t.Run("receive time", func(t *testing.T) {
		c, p := wsTestPair(t, nil)
		for range 3 {
			before := time.Now().UnixNano()
			p.write(srvFrame(finText, []byte("a"), nil), srvFrame(finText, []byte("b"), nil))
			_, at1, err1 := c.ReadMessage()
			_, at2, err2 := c.ReadMessage()
			after := time.Now().UnixNano()
			if err1 != nil || err2 != nil || at1 < before || at2 < at1 || at2 > after {
				t.Fatalf("receive times %d, %d (errors %v, %v) outside [%d, %d]", at1, at2, err1, err2, before, after)
			}
		}
	})
	t.Run("fragmented", func(t *testing.T) {
		c, p := wsTestPair(t, nil)
		p.write(srvFrame(opText, []byte("hel"), nil), srvFrame(opContinuation, []byte("lo "), nil),
			srvFrame(opContinuation, nil, nil), srvFrame(finCont, []byte("world"), nil), srvFrame(finText, []byte("next"), nil))
		if got := readMsg(t, c); got != "hello world" {
			t.Fatalf("got %q", got)
		}
		if got := readMsg(t, c); got != "next" {
			t.Fatalf("then %q", got)
		}
	})
	t.Run("ping inside a fragmented message", func(t *testing.T) {
		c, p := wsTestPair(t, nil)
		p.write(srvFrame(opText, []byte(`{"type":`), nil), srvFrame(0x80|opPing, []byte("are you there"), nil),
			srvFrame(0x80|opPong, []byte("unsolicited"), nil), srvFrame(finCont, []byte(`"next"}`), nil))
		if got := readMsg(t, c); got != `{"type":"next"}` {
			t.Fatalf("got %q", got)
		}
		if op, payload := p.readFrame(); op != opPong || string(payload) != "are you there" {
			t.Fatalf("answer to the ping: opcode %d %q", op, payload)
		}
	})
	t.Run("close with code and reason", func(t *testing.T) {
		c, p := wsTestPair(t, nil)
		p.write(srvFrame(finText, []byte("last"), nil), srvFrame(0x80|opClose, append([]byte{0x0f, 0xa8}, "slow consumer"...), nil))
		if got := readMsg(t, c); got != "last" {
			t.Fatalf("got %q", got)
		}
		_, _, err := c.ReadMessage()
		ce, ok := errors.AsType[*wsCloseError](err)
		if !ok || ce.Code != 4008 || ce.Reason != "slow consumer" {
			t.Fatalf("err = %#v, want a wsCloseError 4008 slow consumer", err)
		}
		if !strings.Contains(err.Error(), "4008") || !strings.Contains(err.Error(), "slow consumer") {
			t.Errorf("message %q does not name the code and reason", err)
		}
		if op, payload := p.readFrame(); op != opClose || !bytes.Equal(payload, []byte{0x0f, 0xa8}) {
			t.Fatalf("answer to the close: opcode %d %x, want the code echoed", op, payload)
		}
		// Close after the server's close sends nothing more and returns at once.
		start := time.Now()
		if err := c.Close(context.Background(), closeNormal, "bye"); err != nil || time.Since(start) > time.Second {
			t.Fatalf("Close: %v after %v", err, time.Since(start))
		}
	})
	t.Run("close without a code", func(t *testing.T) {
		c, p := wsTestPair(t, nil)
		p.write(srvFrame(0x80|opClose, nil, nil))
		if _, _, err := c.ReadMessage(); wsCloseCode(err) != closeNoStatus {
			t.Fatalf("err = %v, want close %d", err, closeNoStatus)
		}
		if op, payload := p.readFrame(); op != opClose || len(payload) != 0 {
			t.Fatalf("answer: opcode %d %x", op, payload)
		}
	})

	for _, tc := range []struct {
		name   string
		frames [][]byte
		want   string
		code   int // the close code the client fails the connection with
	}{
		{"masked server frame", [][]byte{srvFrame(finText, []byte("hi"), []byte{1, 2, 3, 4})}, "masked", closeProtocolError},
		{"oversized length", [][]byte{{finText, 127, 0, 0, 0x10, 0, 0, 0, 0, 0}}, "more than", closeTooBig},
		{"oversized fragments", [][]byte{srvFrame(opText, make([]byte, 40), nil), {finCont, 127, 0, 0, 0, 0, 0x04, 0, 0, 0}}, "more than", closeTooBig},
		{"length with its top bit", [][]byte{{finText, 127, 0x80, 0, 0, 0, 0, 0, 0, 1}}, "most significant", closeProtocolError},
		{"reserved bits", [][]byte{srvFrame(0x80|0x40|opText, []byte("z"), nil)}, "reserved bits 0x40", closeProtocolError},
		{"bad opcode", [][]byte{srvFrame(0x80|0x3, []byte("z"), nil)}, "opcode 0x3", closeProtocolError},
		{"bad control opcode", [][]byte{srvFrame(0x80|0xb, nil, nil)}, "opcode 0xb", closeProtocolError},
		{"continuation first", [][]byte{srvFrame(finCont, []byte("z"), nil)}, "no message to continue", closeProtocolError},
		{"message inside a message", [][]byte{srvFrame(opText, []byte("a"), nil), srvFrame(finText, []byte("b"), nil)}, "inside a fragmented", closeProtocolError},
		{"fragmented ping", [][]byte{srvFrame(opPing, nil, nil)}, "fragmented control", closeProtocolError},
		{"long ping", [][]byte{{0x80 | opPing, 126, 0, 126}}, "at most 125", closeProtocolError},
		{"1-byte close", [][]byte{srvFrame(0x80|opClose, []byte{3}, nil)}, "1-byte", closeProtocolError},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, p := wsTestPair(t, nil)
			p.write(tc.frames...)
			_, _, err := c.ReadMessage()
			if !errors.Is(err, errWSProtocol) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want a protocol error mentioning %q", err, tc.want)
			}
			if op, payload := p.readFrame(); op != opClose || len(payload) != 2 || int(binary.BigEndian.Uint16(payload)) != tc.code {
				t.Fatalf("client's close: opcode %d %x, want code %d", op, payload, tc.code)
			}
			if _, _, err := c.ReadMessage(); err == nil {
				t.Fatal("the failed connection still reads")
			}
		})
	}
	t.Run("truncated", func(t *testing.T) {
		c, p := wsTestPair(t, nil)
		p.write([]byte{finText, 10, 'a', 'b'})
		_ = p.nc.Close()
		if _, _, err := c.ReadMessage(); !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Fatalf("err = %v, want io.ErrUnexpectedEOF", err)
		}
	})
}

// TestWSWriteAndClose checks what the client sends: masked text frames
// with varying keys, and a close handshake whether or not a reader is
// reading.
func TestWSWriteAndClose(t *testing.T) {
	ctx := context.Background()
	c, p := wsTestPair(t, nil)
	long := bytes.Repeat([]byte("0123456789"), 7000)
	for _, msg := range [][]byte{[]byte(`{"type":"connection_init"}`), long, nil} {
		if err := c.WriteText(ctx, msg); err != nil {
			t.Fatal(err)
		}
		if op, got := p.readFrame(); op != opText || !bytes.Equal(got, msg) {
			t.Fatalf("opcode %d, %d bytes, want text %d bytes", op, len(got), len(msg))
		}
	}
	// The mask key varies: the same 8 bytes sent twice look different.
	seen := map[string]bool{}
	for range 8 {
		_ = c.WriteText(ctx, []byte("abcdefgh"))
		raw := make([]byte, 14)
		_, _ = io.ReadFull(p.r, raw)
		seen[string(raw[6:])] = true
	}
	if len(seen) < 2 {
		t.Errorf("8 frames masked the same way")
	}

	t.Run("no reader", func(t *testing.T) {
		c, p := wsTestPair(t, nil)
		// The reader still holds the last message it read (as a client
		// does between reads); Close must not read into its buffer.
		p.write(srvFrame(finText, []byte("held"), nil))
		held, _, err := c.ReadMessage()
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		start := time.Now()
		go func() { done <- c.Close(ctx, 4000, "bye") }()
		if op, payload := p.readFrame(); op != opClose || string(payload[2:]) != "bye" || binary.BigEndian.Uint16(payload) != 4000 {
			t.Fatalf("opcode %d %q", op, payload)
		}
		// Messages before the server's close are discarded.
		p.write(srvFrame(finText, []byte("late"), nil), srvFrame(0x80|opClose, []byte{0x0f, 0xa0}, nil))
		if err := <-done; err != nil || time.Since(start) > 2*time.Second {
			t.Fatalf("Close: %v after %v", err, time.Since(start))
		}
		if err := c.WriteText(ctx, []byte("x")); !errors.Is(err, errWSCloseSent) {
			t.Fatalf("write after close: %v", err)
		}
		if string(held) != "held" {
			t.Fatalf("the message the reader held became %q", held)
		}
	})
	t.Run("reader reading", func(t *testing.T) {
		c, p := wsTestPair(t, nil)
		read := make(chan error, 1)
		go func() {
			_, _, err := c.ReadMessage()
			read <- err
		}()
		// Wait until the reader holds the read lock, so that Close finds
		// a read in progress for certain.
		for c.rmu.TryLock() {
			c.rmu.Unlock()
			runtime.Gosched()
		}
		done := make(chan error, 1)
		start := time.Now()
		go func() { done <- c.Close(ctx, closeNormal, "") }()
		if op, _ := p.readFrame(); op != opClose {
			t.Fatalf("opcode %d", op)
		}
		p.write(srvFrame(0x80|opClose, []byte{0x03, 0xe8}, nil))
		if err := <-read; wsCloseCode(err) != closeNormal {
			t.Fatalf("reader: %v", err)
		}
		if err := <-done; err != nil || time.Since(start) > 2*time.Second {
			t.Fatalf("Close: %v after %v", err, time.Since(start))
		}
	})
	t.Run("server never answers", func(t *testing.T) {
		c, p := wsTestPair(t, nil)
		cctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		defer cancel()
		start := time.Now()
		_ = c.Close(cctx, closeNormal, "")
		if d := time.Since(start); d > 2*time.Second {
			t.Fatalf("Close took %v past its context", d)
		}
		_ = p.nc.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.Copy(io.Discard, p.r); err != nil {
			t.Fatalf("the client did not close the socket: %v", err)
		}
	})
}

// TestWSReadMessageAllocs checks that reading a message, fragmented or
// not, allocates nothing once the buffer has grown to the message size.
func TestWSReadMessageAllocs(t *testing.T) {
	c, p := wsTestPair(t, nil)
	const runs = 1000
	msg := bytes.Repeat([]byte("x"), 400)
	one := append(srvFrame(finText, msg, nil), srvFrame(opText, msg[:100], nil)...)
	one = append(one, srvFrame(finCont, msg[100:], nil)...)
	stream := bytes.Repeat(one, runs+1) // AllocsPerRun runs once more to warm up
	wrote := make(chan error, 1)
	go func() {
		_, err := p.nc.Write(stream)
		wrote <- err
	}()
	allocs := testing.AllocsPerRun(runs, func() {
		for range 2 {
			if m, _, err := c.ReadMessage(); err != nil || len(m) != len(msg) {
				panic(fmt.Sprintf("read: %d bytes, %v", len(m), err))
			}
		}
	})
	if err := <-wrote; err != nil {
		t.Fatal(err)
	}
	if allocs != 0 {
		t.Fatalf("%v allocations per 2 messages, want 0", allocs)
	}
}

// graphqlGatewayConfig starts a gateway on Core NATS and returns a GraphQL
// run's configuration for it, defaults set.
func graphqlGatewayConfig(t *testing.T) Config {
	t.Helper()
	_, b := startNATSBroker(t)
	cfg := Config{URL: startGateway(t, b, nil), Proto: ProtoGraphQL, Events: 10, Timeout: 5 * time.Second}
	if err := cfg.setDefaults(); err != nil {
		t.Fatal(err)
	}
	return cfg
}

// TestGraphQLCloseReported checks, against a real gateway, that a
// connection the gateway closes is reported with its close code and
// reason: a malformed message makes it close with 4400.
func TestGraphQLCloseReported(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cfg := graphqlGatewayConfig(t)
	conn, _, _, err := open(ctx, &cfg, "")
	if err != nil {
		t.Fatal(err)
	}
	c := &client{id: 7, gql: true, conn: conn, v: newVerifier(cfg.Events)}
	if err := conn.(*wsConn).WriteText(ctx, []byte("this is not json")); err != nil {
		t.Fatal(err)
	}
	stop, stopRun := context.WithCancel(ctx)
	defer stopRun()
	finished := make(chan struct{}, 1)
	c.read(ctx, stop, finished)
	<-finished
	if wsCloseCode(c.err) != 4400 {
		t.Fatalf("err = %v, want the gateway's 4400 close", c.err)
	}
	for _, want := range []string{"client 7", "status 4400", "invalid message"} {
		if !strings.Contains(c.err.Error(), want) {
			t.Errorf("report %q does not mention %q", c.err, want)
		}
	}
}

// TestGraphQLCloseHandshake checks that closing a GraphQL client (as the
// end of a run does) completes a close handshake with the gateway at once,
// with and without a reader.
func TestGraphQLCloseHandshake(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cfg := graphqlGatewayConfig(t)
	for _, reading := range []bool{false, true} {
		conn, _, _, err := open(ctx, &cfg, "")
		if err != nil {
			t.Fatal(err)
		}
		read := make(chan error, 1)
		if reading {
			go func() {
				_, _, err := conn.ReadMessage()
				read <- err
			}()
			time.Sleep(50 * time.Millisecond) // let the reader block: Close then waits for it to see the answer
		}
		start := time.Now()
		conn.CloseNormal(ctx)
		if d := time.Since(start); d > time.Second {
			t.Errorf("reading %v: the close handshake took %v", reading, d)
		}
		if reading {
			if err := <-read; wsCloseCode(err) != closeNormal {
				t.Errorf("reader: %v, want the gateway's answering close", err)
			}
		}
	}
}
