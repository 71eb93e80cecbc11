package main

import (
	"bytes"
	"context"
	"net/http"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/fanwire/fanwire/broker/brokertest"
)

func TestFitFDs(t *testing.T) {
	for _, tc := range []struct {
		limit             uint64
		conns, handshakes int
		wantC, wantH      int
		wantOK            bool
	}{
		{1 << 20, 100_000, 4096, 100_000, 4096, true}, // fits
		{20_000, 100_000, 4096, 17_770, 1974, false},  // the handshakes keep a tenth of the room
		{20_000, 100_000, 256, 19_488, 256, false},    // a small handshake cap is kept
		{20_000, 10_000, 4096, 10_000, 4096, true},    // fits as it is
		{20_000, 19_000, 4096, 17_770, 1974, false},   // both lowered
		{20_000, 100_000, 0, 17_770, 1974, false},     // no handshake cap: one is set
		{1 << 62, 100_000, 0, 100_000, 0, true},       // unlimited
		{100, 100_000, 4096, 1, 1, false},             // below the reserve: still a working node
	} {
		c, h, ok := fitFDs(tc.limit, tc.conns, tc.handshakes)
		if c != tc.wantC || h != tc.wantH || ok != tc.wantOK {
			t.Errorf("fitFDs(%d, %d, %d) = %d, %d, %v; want %d, %d, %v", tc.limit, tc.conns, tc.handshakes, c, h, ok, tc.wantC, tc.wantH, tc.wantOK)
		}
		if !ok && uint64(c+h+fdReserve) > tc.limit && tc.limit > fdReserve {
			t.Errorf("fitFDs(%d, ...) = %d + %d + %d reserved: over the limit", tc.limit, c, h, fdReserve)
		}
	}
}

// TestFileLimitBoundsConnections runs fanwire ws with a file descriptor
// limit of 400 (ulimit -n, as a small container would have) and the
// default --max-connections: it logs that it lowered the caps, and the
// connection past them gets 503 max_connections before the upgrade, not an
// accept that fails with EMFILE and leaves the client hanging; the
// connections it holds keep working.
func TestFileLimitBoundsConnections(t *testing.T) {
	bin := buildBinary(t)
	ns := brokertest.NATS(t)
	port, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	listen := "127.0.0.1:" + strconv.Itoa(port)
	var logs syncBuffer
	cmd := exec.Command("sh", "-c", `ulimit -n 400 && exec "$0" "$@"`, bin, "ws", "--listen", listen, "--nats-url", ns.ClientURL(), "--allow-anonymous")
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})
	if !readyWithin(listen, 20*time.Second) {
		t.Fatalf("fanwire ws not ready: %s", logs.String())
	}
	// 400 - 256 reserved = 144: 14 for handshakes, 130 connections.
	if !strings.Contains(logs.String(), "the file descriptor limit (400)") || !strings.Contains(logs.String(), `"max_connections":130`) {
		t.Fatalf("no warning naming the limit and the lowered cap in the log:\n%s", logs.String())
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	conns := make([]*websocket.Conn, 0, 130)
	defer func() {
		for _, c := range conns {
			c.CloseNow()
		}
	}()
	for i := range 130 {
		c, _, err := websocket.Dial(ctx, "ws://"+listen+"/ws", nil)
		if err != nil {
			t.Fatalf("connection %d of 130: %v", i+1, err)
		}
		conns = append(conns, c)
		if _, b, err := c.Read(ctx); err != nil || !bytes.Contains(b, []byte(`"ready"`)) {
			t.Fatalf("connection %d: first message %q, %v", i+1, b, err)
		}
	}
	_, resp, err := websocket.Dial(ctx, "ws://"+listen+"/ws", nil)
	if err == nil || resp == nil || resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("connection 131: %v, %+v; want 503 with Retry-After", err, resp)
	}
	// A place freed is taken again: the node has not run out of
	// descriptors for its own work (the close is the server's to notice,
	// so the new connection may see 503 a few times first).
	conns[0].Close(websocket.StatusNormalClosure, "")
	conns = conns[1:]
	for {
		c, resp, err := websocket.Dial(ctx, "ws://"+listen+"/ws", nil)
		if err == nil {
			conns = append(conns, c)
			break
		}
		if resp == nil || resp.StatusCode != http.StatusServiceUnavailable {
			t.Fatalf("a connection after one closed: %v", err)
		}
	}
}

// syncBuffer is a bytes.Buffer a child process writes while the test reads.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
