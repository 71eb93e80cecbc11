package netconn

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"testing"
	"time"

	"github.com/fanwire/fanwire/broker/brokertest"
)

// tcpPair returns both ends of a loopback TCP connection: the server's
// with an 8 KiB send buffer, the peer's with a 4 KiB receive buffer, so
// that a peer that does not read stalls the server's writes for certain.
func tcpPair(t *testing.T) (srv, peer *net.TCPConn) {
	t.Helper()
	srv, peer = brokertest.TCPPair(t)
	if err := srv.SetWriteBuffer(8 << 10); err != nil {
		t.Fatal(err)
	}
	if err := peer.SetReadBuffer(4 << 10); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	srv.SetDeadline(deadline)
	peer.SetDeadline(deadline)
	return srv, peer
}

// nbBatch frames msgs as a flusher does, into one non-blocking batch, and
// reports whether bytes were left pending. 10 messages of 10 KB are far
// more than the pair's buffers hold.
func nbBatch(t *testing.T, fw *FrameWriter) (want []byte, pending bool) {
	t.Helper()
	if !fw.TryBeginBatch() {
		t.Fatal("no batch on an idle writer")
	}
	for i := range 10 {
		msg := bytes.Repeat([]byte{'a' + byte(i%26)}, 10_000)
		fw.AppendHeader(len(msg))
		fw.Out = append(fw.Out, msg...)
		want = append(want, 0x81, 126, byte(len(msg)>>8), byte(len(msg)))
		want = append(want, msg...)
		if err := fw.TryFlush(); err != nil {
			t.Fatal(err)
		}
	}
	pending, err := fw.EndBatchNB()
	if err != nil {
		t.Fatal(err)
	}
	return want, pending
}

// unstall lets the peer read at full speed: with a 4 KiB window the rest
// would crawl through zero-window probes.
func unstall(t *testing.T, srv, peer *net.TCPConn) {
	t.Helper()
	if err := peer.SetReadBuffer(1 << 20); err != nil {
		t.Fatal(err)
	}
	if err := srv.SetWriteBuffer(1 << 20); err != nil {
		t.Fatal(err)
	}
}

// TestFrameWriterNonBlocking: a non-blocking batch that meets a full
// socket keeps the rest pending instead of waiting; no batch begins while
// bytes are pending; the rest reaches the peer whole, before any later
// frame: the library's (Write) or the writer's own (FlushPending).
func TestFrameWriterNonBlocking(t *testing.T) {
	if testing.Short() {
		t.Skip("-short (make test-quick) leaves out the slow tests: make test runs them")
	}
	t.Run("library frame after pending bytes", func(t *testing.T) {
		srv, peer := tcpPair(t)
		fw := &FrameWriter{c: srv}
		fw.initRaw()
		if !fw.NonBlocking() {
			t.Fatal("a TCP socket is not written without blocking")
		}
		want, pending := nbBatch(t, fw)
		if !pending {
			t.Fatal("the batch did not meet a full socket")
		}
		if fw.TryBeginBatch() {
			t.Fatal("a batch began while bytes were pending")
		}
		unstall(t, srv, peer)
		ping := []byte{0x89, 4, 'p', 'i', 'n', 'g'}
		want = append(want, ping...)
		wrote := make(chan error, 1)
		go func() { // the library's frame: waits for the pending bytes
			bw := bufio.NewWriterSize(fw, 16)
			if _, err := bw.Write(ping); err != nil {
				wrote <- err
				return
			}
			wrote <- bw.Flush()
		}()
		got := make([]byte, len(want))
		if _, err := io.ReadFull(peer, got); err != nil {
			t.Fatal(err)
		}
		if err := <-wrote; err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("peer received a different stream (%s)", firstDiff(got, want))
		}
		if !fw.TryBeginBatch() {
			t.Fatal("no batch once the pending bytes went out")
		}
		if pending, err := fw.EndBatchNB(); pending || err != nil {
			t.Fatalf("empty batch: pending %v, %v", pending, err)
		}
	})
	t.Run("FlushPending", func(t *testing.T) {
		srv, peer := tcpPair(t)
		fw := &FrameWriter{c: srv}
		fw.initRaw()
		want, pending := nbBatch(t, fw)
		if !pending {
			t.Fatal("the batch did not meet a full socket")
		}
		unstall(t, srv, peer)
		got := make(chan []byte, 1)
		go func() {
			b := make([]byte, len(want))
			_, _ = io.ReadFull(peer, b)
			got <- b
		}()
		if err := fw.FlushPending(); err != nil {
			t.Fatal(err)
		}
		if b := <-got; !bytes.Equal(b, want) {
			t.Fatalf("peer received a different stream (%s)", firstDiff(b, want))
		}
	})
	t.Run("closed socket", func(t *testing.T) {
		srv, _ := tcpPair(t)
		fw := &FrameWriter{c: srv}
		fw.initRaw()
		srv.Close()
		if !fw.TryBeginBatch() {
			t.Fatal("no batch")
		}
		fw.AppendHeader(2)
		fw.Out = append(fw.Out, "hi"...)
		if pending, err := fw.EndBatchNB(); pending || err == nil {
			t.Fatalf("write to a closed socket: pending %v, err %v", pending, err)
		}
	})
}
