package gateway_test

import (
	"bytes"
	"context"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/fanwire/fanwire/gateway"
)

// The shared flushers (package internal/flush) write plain-TCP native connections
// without blocking; a socket that would block hands its connection to a
// writer goroutine of its own. These tests stall clients' sockets for
// certain: a client with a 4 KiB receive buffer that does not read, sent
// more than any send buffer holds (tcp_wmem's usual maximum is 4 MiB).

// stalledBytes is sent to a stalled client: more than its socket's
// buffers can hold, so a write would block.
const stalledBytes = 6 << 20

// dialRaw dials the gateway and returns the connection after its ready
// message. With small, its receive buffer is 4 KiB. Nothing reads it until
// the test does.
func dialRaw(t *testing.T, e *env, small bool) *websocket.Conn {
	t.Helper()
	c, _ := dialRawAddr(t, e, small)
	return c
}

// dialRawAddr is dialRaw that also returns the connection's local address
// (writeGate.hold's).
func dialRawAddr(t *testing.T, e *env, small bool) (*websocket.Conn, string) {
	t.Helper()
	d := &net.Dialer{}
	if small {
		d.Control = setRcvBuf
	}
	var local string
	tr := &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		nc, err := d.DialContext(ctx, network, addr)
		if err == nil {
			local = nc.LocalAddr().String()
		}
		return nc, err
	}}
	t.Cleanup(tr.CloseIdleConnections)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, _, err := websocket.Dial(ctx, e.wsURL(), &websocket.DialOptions{HTTPClient: &http.Client{Transport: tr}})
	if err != nil {
		t.Fatal(err)
	}
	c.SetReadLimit(64 << 20)
	t.Cleanup(func() { _ = c.CloseNow() })
	if _, b, err := c.Read(ctx); err != nil || !bytes.Contains(b, []byte(`"type":"ready"`)) {
		t.Fatalf("first message %q, %v; want ready", b, err)
	}
	return c, local
}

// setRcvBuf is a net.Dialer's Control: a 4 KiB receive buffer.
func setRcvBuf(_, _ string, rc syscall.RawConn) error {
	var serr error
	if err := rc.Control(func(fd uintptr) {
		serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4<<10)
	}); err != nil {
		return err
	}
	return serr
}

// subscribeRaw subscribes c to subject as id and waits for the reply.
func subscribeRaw(t *testing.T, c *websocket.Conn, id, subject string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.Write(ctx, websocket.MessageText, []byte(`{"type":"subscribe","id":"`+id+`","subject":"`+subject+`"}`)); err != nil {
		t.Fatal(err)
	}
	if _, b, err := c.Read(ctx); err != nil || !bytes.Contains(b, []byte(`"type":"subscribed"`)) {
		t.Fatalf("reply %q, %v; want subscribed", b, err)
	}
}

// bulkEvent is event i with pad bytes of padding.
func bulkEvent(i int, pad string) []byte {
	return []byte(`{"i":` + strconv.Itoa(i) + `,"pad":"` + pad + `"}`)
}

// seqReader reads a raw connection's frames and checks that its events'
// "i" run from next on, one by one, without decoding the padding.
type seqReader struct {
	t      *testing.T
	c      *websocket.Conn
	next   int
	frames []int // each frame's payload size
}

// readUntil reads events until it has seen every one before n; it returns
// the read error (a close) if the connection ends first.
func (r *seqReader) readUntil(n int, d time.Duration) error {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	for r.next < n {
		_, b, err := r.c.Read(ctx)
		if err != nil {
			return err
		}
		r.frames = append(r.frames, len(b))
		for _, line := range bytes.Split(b, []byte("\n")) {
			k := bytes.Index(line, []byte(`"data":{"i":`))
			if k < 0 {
				r.t.Fatalf("message %.80q is not a bulk event", line)
			}
			num := line[k+len(`"data":{"i":`):]
			num = num[:bytes.IndexByte(num, ',')]
			if got, _ := strconv.Atoi(string(num)); got != r.next {
				r.t.Fatalf("event %d arrived where %d was due", got, r.next)
			}
			r.next++
		}
	}
	return nil
}

// TestStalledClientOnSharedFlushers: clients that keep reading get every
// event while one client on the same flushers reads nothing; that one's
// socket fills, its connection goes to a writer of its own, its mailbox
// overflows and it is closed with 4008 after what was queued before the
// overflow, exactly as with a writer per connection.
func TestStalledClientOnSharedFlushers(t *testing.T) {
	e := newEnv(t, func(c *gateway.Config) {
		c.MailboxMessages = 1024
		c.CloseTimeout = time.Minute // the stalled client reads only at the end
	})
	stalled := dialRaw(t, e, true)
	subscribeRaw(t, stalled, "s", "bulk.*")
	var good []*seqReader
	for i := range 2 {
		c := dialRaw(t, e, false)
		subscribeRaw(t, c, "g"+strconv.Itoa(i), "bulk.*")
		good = append(good, &seqReader{t: t, c: c})
	}
	// 8,000 events of 4 KiB (32 MiB): more than the stalled socket's
	// buffers and its 1,024-message mailbox hold together.
	pad := strings.Repeat("x", 4<<10)
	const n, step = 8000, 200
	for i := 0; i < n; i += step {
		for j := i; j < i+step; j++ {
			if err := e.nc.Publish("bulk.x", bulkEvent(j, pad)); err != nil {
				t.Fatal(err)
			}
		}
		if err := e.nc.Flush(); err != nil {
			t.Fatal(err)
		}
		for _, g := range good {
			if err := g.readUntil(i+step, 30*time.Second); err != nil {
				t.Fatalf("a reading client stopped at event %d: %v", g.next, err)
			}
		}
	}
	waitFor(t, "slow consumer found", func() bool { return e.metric("fanwire_slow_consumers_total", nil) == 1 })
	if h := e.metric("fanwire_writer_handoffs_total", nil); h < 1 {
		t.Fatalf("writer handoffs %v: the stalled socket never went to a writer of its own", h)
	}
	r := &seqReader{t: t, c: stalled}
	err := r.readUntil(n, 30*time.Second)
	if code := websocket.CloseStatus(err); code != gateway.CloseSlowConsumer {
		t.Fatalf("stalled client: %d events, then %v; want a 4008 close", r.next, err)
	}
	if r.next == 0 || r.next >= n {
		t.Fatalf("stalled client got %d of %d events before 4008", r.next, n)
	}
	waitFor(t, "slow_consumer counted", func() bool {
		return e.metric("fanwire_disconnects_total", map[string]string{"reason": "slow_consumer"}) == 1
	})
}

// TestPausedClientGetsEverythingAfterPartialWrites: a client that pauses
// while more than its socket holds is queued (without overflowing) gets
// every event in order once it reads again, the frames cut by a write that
// would have blocked arrive whole, and the connection goes on serving.
func TestPausedClientGetsEverythingAfterPartialWrites(t *testing.T) {
	e := newEnv(t, func(c *gateway.Config) {
		c.MailboxMessages = 1 << 16
		c.MailboxBytes = 64 << 20
	})
	c := dialRaw(t, e, true)
	subscribeRaw(t, c, "s", "bulk.*")
	pad := strings.Repeat("y", 4<<10-100)
	n := stalledBytes / (4 << 10)
	for i := range n {
		if err := e.nc.Publish("bulk.x", bulkEvent(i, pad)); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the socket full", func() bool { return e.metric("fanwire_writer_handoffs_total", nil) >= 1 })
	r := &seqReader{t: t, c: c}
	if err := r.readUntil(n, 30*time.Second); err != nil {
		t.Fatalf("after %d events: %v", r.next, err)
	}
	// Back on the flushers (or still on its own writer): it goes on.
	for i := n; i < n+10; i++ {
		e.publish("bulk.x", string(bulkEvent(i, "z")))
	}
	if err := r.readUntil(n+10, 10*time.Second); err != nil {
		t.Fatalf("after %d events: %v", r.next, err)
	}
	if d := e.metric("fanwire_disconnects_total", nil); d != 0 {
		t.Fatalf("%v disconnects", d)
	}
}

// TestCloseWhileBytesPending: a close requested while a flusher's bytes
// wait for a stalled socket comes after them. A shutdown (1001) delivers
// every queued event and then closes; a client that drops its socket
// instead ends the blocked write, and the server serves the others on.
func TestCloseWhileBytesPending(t *testing.T) {
	stall := func(t *testing.T, e *env) (*websocket.Conn, int) {
		c := dialRaw(t, e, true)
		subscribeRaw(t, c, "s", "bulk.*")
		pad := strings.Repeat("w", 4<<10-100)
		n := stalledBytes / (4 << 10)
		for i := range n {
			if err := e.nc.Publish("bulk.x", bulkEvent(i, pad)); err != nil {
				t.Fatal(err)
			}
		}
		if err := e.nc.Flush(); err != nil {
			t.Fatal(err)
		}
		// Every event queued (a shutdown delivers what is queued), and
		// the socket full.
		waitFor(t, "every event dispatched", func() bool { return e.metric("fanwire_deliveries_total", nil) == float64(n) })
		waitFor(t, "the socket full", func() bool { return e.metric("fanwire_writer_handoffs_total", nil) >= 1 })
		return c, n
	}
	big := func(c *gateway.Config) {
		c.MailboxMessages = 1 << 16
		c.MailboxBytes = 64 << 20
		c.CloseTimeout = time.Minute
	}
	t.Run("shutdown", func(t *testing.T) {
		e := newEnv(t, big)
		c, n := stall(t, e)
		var wg sync.WaitGroup
		wg.Go(e.stop) // waits for the client to read everything and close
		r := &seqReader{t: t, c: c}
		err := r.readUntil(n+1, 30*time.Second) // there is no event n: reads to the close
		if code := websocket.CloseStatus(err); code != websocket.StatusGoingAway || r.next != n {
			t.Fatalf("%d of %d events, then %v; want all, then 1001", r.next, n, err)
		}
		wg.Wait()
	})
	t.Run("client drops", func(t *testing.T) {
		e := newEnv(t, big)
		other := e.dial()
		other.subscribe("o", "other")
		c, _ := stall(t, e)
		_ = c.CloseNow()
		waitFor(t, "the dropped client's disconnect", func() bool { return e.metric("fanwire_connections", nil) == 1 })
		e.publish("other", `"still here"`)
		other.expect(map[string]any{"type": "event", "data": "still here"})
	})
}

// TestFramesSplitAtMaxFrameBytes: the flushers cut a batch into frames of
// at most MaxFrameBytes, '\n'-separated; an event larger than that gets a
// frame of its own.
func TestFramesSplitAtMaxFrameBytes(t *testing.T) {
	const limit = 2000
	e := newEnv(t, func(c *gateway.Config) { c.MaxFrameBytes = limit })
	c := dialRaw(t, e, true)
	subscribeRaw(t, c, "s", "bulk.*")
	const n = 60
	for i := range n {
		pad := strings.Repeat("p", 300)
		if i == 30 {
			pad = strings.Repeat("P", 3*limit)
		}
		if err := e.nc.Publish("bulk.x", bulkEvent(i, pad)); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	r := &seqReader{t: t, c: c}
	if err := r.readUntil(n, 10*time.Second); err != nil {
		t.Fatalf("after %d events: %v", r.next, err)
	}
	bigFrames := 0
	for _, size := range r.frames {
		if size > limit {
			bigFrames++
		}
	}
	if bigFrames != 1 || len(r.frames) < 3 {
		t.Fatalf("frame sizes %v: want frames of at most %d bytes but the one large event's", r.frames, limit)
	}
}
