package netconn

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"testing"
	"time"

	"github.com/fanwire/fanwire/broker/brokertest"
)

// wsFrame builds a server frame per RFC 6455 §5.2: FIN and opcode text,
// unmasked, with a hdrLen-byte header (2, 4 or 10; 4 and 10 may encode a
// length the shorter form could hold, which FrameWriter must accept too).
func wsFrame(payload []byte, hdrLen int) []byte {
	n := len(payload)
	f := []byte{0x81}
	switch hdrLen {
	case 2:
		if n > 125 {
			panic("payload too long for a 2-byte header")
		}
		f = append(f, byte(n))
	case 4:
		if n > 0xffff {
			panic("payload too long for a 4-byte header")
		}
		f = append(f, 126)
		f = binary.BigEndian.AppendUint16(f, uint16(n))
	case 10:
		f = append(f, 127)
		f = binary.BigEndian.AppendUint64(f, uint64(n))
	default:
		panic("bad header length")
	}
	return append(f, payload...)
}

// testFrames returns frames of the sizes that straddle FrameWriter's and the
// 16-byte bufio.Writer's boundaries, each with every header form that can
// express its length.
func testFrames() [][]byte {
	rng := rand.New(rand.NewPCG(7, 7))
	var frames [][]byte
	for _, n := range []int{0, 1, 14, 15, 16, 125, 126, 127, 65535, 65536, 100000} {
		payload := make([]byte, n)
		for i := range payload {
			payload[i] = byte(rng.Uint32())
		}
		for _, h := range []int{2, 4, 10} {
			if h == 2 && n > 125 || h == 4 && n > 0xffff {
				continue
			}
			frames = append(frames, wsFrame(payload, h))
		}
	}
	return frames
}

// writeFramesLikeWebsocket writes each frame as coder/websocket does: the
// header, then the payload in one Write, then a Flush (every frame the
// gateway sends has FIN set). Without flush, frames follow each other in the
// bufio.Writer with no flush between them.
func writeFramesLikeWebsocket(t testing.TB, bw *bufio.Writer, frames [][]byte, flush bool) {
	t.Helper()
	for _, f := range frames {
		hdr := 2
		switch f[1] & 0x7f {
		case 126:
			hdr = 4
		case 127:
			hdr = 10
		}
		for _, b := range f[:2] {
			if err := bw.WriteByte(b); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := bw.Write(f[2:hdr]); err != nil {
			t.Fatal(err)
		}
		if _, err := bw.Write(f[hdr:]); err != nil {
			t.Fatal(err)
		}
		if flush {
			if err := bw.Flush(); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := bw.Flush(); err != nil {
		t.Fatal(err)
	}
}

// recConn is a net.Conn that records each Write. It is not a *net.TCPConn,
// so net.Buffers.WriteTo falls back to one Write per buffer: a writev of
// held bytes and the rest shows up as two consecutive Writes.
type recConn struct {
	net.Conn // nil: only Write is used
	writes   [][]byte
}

func (c *recConn) Write(p []byte) (int, error) {
	c.writes = append(c.writes, bytes.Clone(p))
	return len(p), nil
}

// writesPerFrame maps the recorded writes onto frames: it fails if the bytes
// differ from the frames or a write spans a frame boundary, and returns the
// writes that make up each frame.
func writesPerFrame(t testing.TB, frames, writes [][]byte) [][][]byte {
	t.Helper()
	if got, want := bytes.Join(writes, nil), bytes.Join(frames, nil); !bytes.Equal(got, want) {
		t.Fatalf("conn received %d bytes, want %d (%s)", len(got), len(want), firstDiff(got, want))
	}
	out := make([][][]byte, len(frames))
	w := 0
	for i, f := range frames {
		for rest := len(f); rest > 0; w++ {
			if len(writes[w]) > rest {
				t.Fatalf("frame %d (%d bytes): write %d of %d bytes runs %d bytes into the next frame", i, len(f), w, len(writes[w]), len(writes[w])-rest)
			}
			rest -= len(writes[w])
			out[i] = append(out[i], writes[w])
		}
		if len(f) == 0 {
			t.Fatalf("frame %d is empty", i)
		}
	}
	for ; w < len(writes); w++ {
		if len(writes[w]) != 0 {
			t.Fatalf("write %d after the last frame", w)
		}
	}
	return out
}

func firstDiff(a, b []byte) string {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return fmt.Sprintf("first difference at byte %d", i)
		}
	}
	return fmt.Sprintf("one is a prefix of the other at %d", min(len(a), len(b)))
}

// TestFrameWriterChunking checks FrameWriter's reassembly with a recording
// conn: every frame reaches the conn whole and in order, never sharing a
// write with another frame. With a flush per frame (what coder/websocket
// does for every FIN frame, the only kind the gateway sends), a frame that
// fits in bufio's 16 bytes takes exactly one Write, and a longer one the
// held 16-byte chunk plus the rest, i.e. one writev on a real socket (see
// TestFrameWriterTCP).
func TestFrameWriterChunking(t *testing.T) {
	frames := testFrames()
	for _, flush := range []bool{true, false} {
		t.Run(fmt.Sprintf("flush=%v", flush), func(t *testing.T) {
			rc := &recConn{}
			fw := &FrameWriter{c: rc}
			writeFramesLikeWebsocket(t, bufio.NewWriterSize(fw, 16), frames, flush)
			if fw.nh != 0 || fw.need != 0 {
				t.Errorf("FrameWriter holds %d bytes and needs %d after the last frame", fw.nh, fw.need)
			}
			split := 0
			for i, ws := range writesPerFrame(t, frames, rc.writes) {
				n := len(frames[i])
				if !flush {
					// Frames share bufio chunks, so a header can straddle
					// two of them; FrameWriter then joins more than it can
					// hold and sends the frame in plain Writes. Only bytes
					// and frame boundaries are guaranteed (checked above).
					if len(ws) > 2 || len(ws) == 2 && len(ws[0]) > len(FrameWriter{}.held) {
						split++
					}
					continue
				}
				switch {
				case n <= 16 && len(ws) != 1:
					t.Errorf("frame %d (%d bytes) fits in bufio's buffer but took %d writes (%v)", i, n, len(ws), lens(ws))
				case n > 16 && (len(ws) != 2 || len(ws[0]) != 16):
					// held + rest is one writev on a TCP conn.
					t.Errorf("frame %d (%d bytes) took writes %v, want the held 16 bytes and the rest", i, n, lens(ws))
				}
			}
			if split > 0 {
				t.Logf("without a flush per frame, %d of %d frames were not one writev", split, len(frames))
			}
		})
	}
}

func lens(ws [][]byte) []int {
	out := make([]int, len(ws))
	for i, w := range ws {
		out[i] = len(w)
	}
	return out
}

// TestFrameWriterArbitraryChunks feeds the frame stream to FrameWriter in
// random pieces, including pieces that split a header: the bytes arrive
// exactly, no write spans two frames, and a frame is never held back once
// its last byte was written.
func TestFrameWriterArbitraryChunks(t *testing.T) {
	var frames [][]byte
	for _, f := range testFrames() {
		if len(f) < 1000 {
			frames = append(frames, f)
		}
	}
	frames = append(frames, frames...)
	stream := bytes.Join(frames, nil)
	var ends []int // cumulative frame ends
	for i, f := range frames {
		ends = append(ends, len(f))
		if i > 0 {
			ends[i] += ends[i-1]
		}
	}
	rng := rand.New(rand.NewPCG(1, 1))
	for round := range 200 {
		rc := &recConn{}
		fw := &FrameWriter{c: rc}
		for off := 0; off < len(stream); {
			n := 1 + rng.IntN(20)
			if rng.IntN(8) == 0 {
				n = 1 + rng.IntN(300)
			}
			n = min(n, len(stream)-off)
			if k, err := fw.Write(stream[off : off+n]); k != n || err != nil {
				t.Fatalf("round %d: Write(%d bytes) = %d, %v", round, n, k, err)
			}
			off += n
			written := 0
			for _, w := range rc.writes {
				written += len(w)
			}
			// Every frame that ended within the input so far is out.
			complete := 0
			for _, e := range ends {
				if e <= off {
					complete = e
				}
			}
			if written < complete {
				t.Fatalf("round %d: after %d bytes in, %d written: a complete frame (ending at %d) is held back", round, off, written, complete)
			}
		}
		writesPerFrame(t, frames, rc.writes)
	}
}

// tcpConn records the Writes that reach a real *net.TCPConn. Embedding the
// *net.TCPConn keeps its writev support, so net.Buffers.WriteTo bypasses
// Write: a frame sent as one writev records no Write at all.
type tcpConn struct {
	*net.TCPConn
	writes [][]byte
}

func (c *tcpConn) Write(p []byte) (int, error) {
	c.writes = append(c.writes, bytes.Clone(p))
	return c.TCPConn.Write(p)
}

// TestFrameWriterTCP sends the frames over a real loopback TCP connection
// through a 16-byte bufio.Writer, as HijackWriter sets it up: the peer
// receives exactly the frames, and only frames that fit in one 16-byte chunk
// are written with Write; every longer frame goes out in a single writev.
func TestFrameWriterTCP(t *testing.T) {
	frames := testFrames()
	srv, peer := brokertest.TCPPair(t)
	deadline := time.Now().Add(10 * time.Second)
	peer.SetDeadline(deadline)
	srv.SetDeadline(deadline)

	received := make(chan []byte, 1)
	go func() {
		b, _ := io.ReadAll(peer)
		received <- b
	}()
	tc := &tcpConn{TCPConn: srv}
	writeFramesLikeWebsocket(t, bufio.NewWriterSize(&FrameWriter{c: tc}, 16), frames, true)
	srv.Close()
	got := <-received
	if want := bytes.Join(frames, nil); !bytes.Equal(got, want) {
		t.Fatalf("peer received %d bytes, want %d (%s)", len(got), len(want), firstDiff(got, want))
	}
	var small [][]byte
	for _, f := range frames {
		if len(f) <= 16 {
			small = append(small, f)
		}
	}
	if len(tc.writes) != len(small) {
		t.Fatalf("%d Write calls (%v), want one per frame of at most 16 bytes (%d); longer frames go out by writev", len(tc.writes), lens(tc.writes), len(small))
	}
	for i := range small {
		if !bytes.Equal(tc.writes[i], small[i]) {
			t.Errorf("Write %d = %d bytes, want frame of %d bytes", i, len(tc.writes[i]), len(small[i]))
		}
	}
}

func TestFrameLen(t *testing.T) {
	ext16 := func(n uint16) []byte { return binary.BigEndian.AppendUint16(nil, n) }
	ext64 := func(n uint64) []byte { return binary.BigEndian.AppendUint64(nil, n) }
	cat := func(parts ...[]byte) []byte { return bytes.Join(parts, nil) }
	tests := []struct {
		name string
		p    []byte
		n    int64
		ok   bool
	}{
		{"empty", nil, 0, false},
		{"one byte", []byte{0x81}, 0, false},
		{"2-byte header, empty payload", []byte{0x81, 0}, 2, true},
		{"2-byte header", []byte{0x81, 5, 'h', 'e'}, 7, true},
		{"2-byte header, 125", []byte{0x81, 125}, 127, true},
		{"4-byte header, length missing", []byte{0x81, 126}, 0, false},
		{"4-byte header, length half there", []byte{0x81, 126, 1}, 0, false},
		{"4-byte header", cat([]byte{0x81, 126}, ext16(256)), 260, true},
		{"4-byte header, 65535", cat([]byte{0x81, 126}, ext16(65535)), 65539, true},
		{"10-byte header, length missing", []byte{0x81, 127}, 0, false},
		{"10-byte header, length 7 of 8 bytes", cat([]byte{0x81, 127}, ext64(1)[:7]), 0, false},
		{"10-byte header", cat([]byte{0x81, 127}, ext64(100000)), 100010, true},
		{"10-byte header, 65536", cat([]byte{0x81, 127}, ext64(65536)), 65546, true},
		{"masked 2-byte header", []byte{0x81, 0x80 | 5}, 11, true},
		{"masked 4-byte header", cat([]byte{0x81, 0x80 | 126}, ext16(200)), 208, true},
		{"masked 10-byte header", cat([]byte{0x81, 0x80 | 127}, ext64(70000)), 70014, true},
		{"masked, length truncated", []byte{0x81, 0x80 | 127, 0, 0}, 0, false},
		{"close frame", []byte{0x88, 2, 0x03, 0xe8}, 4, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n, ok := frameLen(tt.p)
			if n != tt.n || ok != tt.ok {
				t.Errorf("frameLen(% x) = %d, %v; want %d, %v", tt.p, n, ok, tt.n, tt.ok)
			}
		})
	}
}

// TestFrameWriterBatches: a batch of messages framed by the gateway itself
// starts only at a frame boundary of what reached the socket (never inside
// a library frame), leaves in one write, and nothing follows a close frame.
func TestFrameWriterBatches(t *testing.T) {
	rc := &recConn{}
	fw := &FrameWriter{c: rc}
	bw := bufio.NewWriterSize(fw, 16)
	ping := append([]byte{0x89, 100}, bytes.Repeat([]byte{'p'}, 100)...)
	// The library's frame is partway through: its first 16 bytes are held.
	if _, err := bw.Write(ping[:40]); err != nil {
		t.Fatal(err)
	}
	if fw.BeginBatch() {
		t.Fatal("a batch began inside a library frame")
	}
	if _, err := bw.Write(ping[40:]); err != nil {
		t.Fatal(err)
	}
	if err := bw.Flush(); err != nil {
		t.Fatal(err)
	}
	if !fw.BeginBatch() {
		t.Fatal("no batch at a frame boundary")
	}
	msgs := [][]byte{[]byte(`{"a":1}`), bytes.Repeat([]byte{'x'}, 300), bytes.Repeat([]byte{'y'}, 70000)}
	for _, m := range msgs[:2] {
		if err := fw.AppendText(m); err != nil {
			t.Fatal(err)
		}
	}
	before := len(rc.writes)
	if err := fw.AppendText(msgs[2]); err != nil { // over batchLimit: written at once
		t.Fatal(err)
	}
	if len(rc.writes) != before+1 {
		t.Fatalf("a full batch was not written")
	}
	if err := fw.EndBatch(); err != nil {
		t.Fatal(err)
	}
	want := [][]byte{ping}
	for _, m := range msgs {
		var h []byte
		switch n := len(m); {
		case n < 126:
			h = []byte{0x81, byte(n)}
		case n < 1<<16:
			h = []byte{0x81, 126, byte(n >> 8), byte(n)}
		default:
			h = []byte{0x81, 127, 0, 0, 0, 0, 0, byte(n >> 16), byte(n >> 8), byte(n)}
		}
		want = append(want, append(h, m...))
	}
	if got := bytes.Join(rc.writes, nil); !bytes.Equal(got, bytes.Join(want, nil)) {
		t.Fatalf("stream differs: got %d bytes, want %d", len(got), len(bytes.Join(want, nil)))
	}
	// After a close frame no batch may begin.
	if _, err := bw.Write([]byte{0x88, 2, 0x03, 0xe9}); err != nil {
		t.Fatal(err)
	}
	if err := bw.Flush(); err != nil {
		t.Fatal(err)
	}
	if fw.BeginBatch() {
		t.Fatal("a batch began after a close frame")
	}
}
