package loadtest

import (
	"bytes"
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
)

// readLimit is the largest frame (native) or message (GraphQL) a client
// accepts. The gateway coalesces many native events into one frame, so
// frames far past coder/websocket's 32 KiB default are normal.
const readLimit = 64 << 20

// client is one subscribed connection and the tallies of what it received.
type client struct {
	id        int          // static after dialClient
	gql       bool         // static after dialClient: speaks graphql-transport-ws, one message per frame (Config.Proto)
	conn      wireConn     // read only by read, closed by read or its watcher; replaced by read when it drops (rc)
	subCursor string       // static after Run's connectAll: the "subscribed" reply's cursor, or a resume run's primer's for GraphQL ("" on Core NATS)
	rc        *reconnector // nil unless the client drops and resumes (Config.ResumeShare, Config.StormURL); set before read starts, then owned by it

	// Owned by the reader goroutine; Run reads them only after it has exited.
	v                verifier
	lat              histogram
	serverErrors     int64
	firstServerError string
	malformed        int64
	leaves           int64 // leave messages: no run of ours moves a document out of a view
	err              error // why the connection ended before the run stopped; nil otherwise

	// Stored by the reader once per frame that carried events, loaded by the monitor.
	delivered atomic.Int64
	lastNanos atomic.Int64 // receive time (unix ns) of the last frame that carried an event

	// Publishes of this client's own events (Config.PublishVia ws or
	// http) the gateway accepted, and when the last one was: stored by
	// the reader (ws: "published" replies) or by the client's publisher
	// (http: 200 answers), never both in one run.
	acked     atomic.Int64
	lastAcked atomic.Int64 // unix ns
	// wantAcks is how many "published" replies the reader must read
	// before the client is finished (ws publishing: its own events'): a
	// reply can come after the event itself, which finished the client
	// one reply short of the count (seen in CI: 319 of 320).
	wantAcks int64
}

// read consumes frames until stop ends or the connection fails, and sends on
// finished exactly once: when the client holds every event, or when its
// connection ends before that. It keeps reading after completion so late
// duplicates are still counted. On return the connection is closed.
//
// A client with a reconnector drops its connection at the planned points
// and resumes on a new one (see reconnect); the frame in which it drops is
// abandoned after the event that triggered the drop, as a real client
// loses what it had not processed.
//
// Messages are read without a context (see wireConn): one watcher per
// connection closes it when stop ends, which unblocks the read.
func (c *client) read(ctx, stop context.Context, finished chan<- struct{}) {
	unwatch := closeOnDone(ctx, stop, c.conn)
	defer func() { unwatch() }() // the watcher of the last connection
	signalled := false
	end := func(err error) {
		if err != nil && stop.Err() == nil {
			c.err = fmt.Errorf("client %d: %w", c.id, err)
			_ = c.conn.CloseNow() // the connection is already broken; there is nobody to hand-shake with
		}
		if !signalled {
			finished <- struct{}{}
		}
	}
	drop := c.rc != nil && c.rc.due(0) // a drop before the first event resumes from the subscribed reply's cursor
	for {
		var frame []byte
		var now int64
		if drop {
			// The old connection is ours to close from here (or stop's
			// watcher has closed it); reconnect does, and its dial ends
			// with stop.
			unwatch()
			unwatch = func() {}
			rest, err := c.reconnect(stop)
			if err != nil {
				end(err)
				return
			}
			unwatch = closeOnDone(ctx, stop, c.conn)
			frame, now = rest, time.Now().UnixNano()
		} else {
			msg, at, err := c.conn.ReadMessage()
			if err != nil && (c.rc == nil || c.rc.st == nil || stop.Err() != nil) {
				end(fmt.Errorf("read: %w", err))
				return
			}
			if err != nil {
				// A storm's client (Config.StormURL): whatever ended
				// the connection (node A's 1001, a 4008), it comes
				// back on node B after fanwire.js's backoff.
				unwatch()
				unwatch = func() {}
				rest, err := c.rejoin(stop, err)
				if err != nil {
					end(err)
					return
				}
				unwatch = closeOnDone(ctx, stop, c.conn)
				msg, at = rest, time.Now().UnixNano()
			}
			frame, now = msg, at
		}
		drop = c.handleFrame(frame, now)
		if !signalled && c.v.complete() && c.acked.Load() >= c.wantAcks {
			signalled = true
			finished <- struct{}{}
		}
	}
}

// splitFrame takes the first message off a frame: a native frame holds
// newline-separated messages, a GraphQL one exactly one.
func splitFrame(frame []byte, gql bool) (msg, rest []byte, kind msgKind, seq uint64, ts int64) {
	if gql {
		kind, seq, ts = parseNext(frame)
		return frame, nil, kind, seq, ts
	}
	msg, rest = nextMessage(frame)
	kind, seq, ts = parseMessage(msg)
	return msg, rest, kind, seq, ts
}

// handleFrame verifies every event in one frame. now is the frame's receive
// time: every event in a frame arrived at that moment, so one clock read per
// frame serves them all (a GraphQL message's is when the socket read that
// completed it returned: see wsConn.ReadMessage). It allocates nothing for
// events. It reports drop when the client has reached a planned drop point:
// it then stops at that event and keeps its cursor to resume from. A native frame holds
// newline-separated messages, a GraphQL one (c.gql) exactly one.
func (c *client) handleFrame(frame []byte, now int64) (drop bool) {
	events := false
	var lastEvent []byte // a storm client keeps its cursor
	for len(frame) > 0 {
		var msg []byte
		var kind msgKind
		var seq uint64
		var ts int64
		msg, frame, kind, seq, ts = splitFrame(frame, c.gql)
		switch kind {
		case kindEvent:
			c.v.observe(seq)
			c.lat.record(now - ts)
			events = true
			lastEvent = msg
			if c.rc != nil && c.rc.due(c.v.delivered) {
				if c.gql {
					c.rc.cursor = nextCursor(msg)
				} else {
					c.rc.cursor = eventCursor(msg)
				}
				drop, frame = true, nil
			}
		case kindPublished:
			c.acked.Add(1)
			c.lastAcked.Store(now)
		case kindError:
			c.serverErrors++
			if c.firstServerError == "" {
				c.firstServerError = string(msg)
			}
		case kindMalformed:
			c.malformed++
		case kindLeave:
			c.leaves++
		}
	}
	if events {
		c.delivered.Store(c.v.delivered)
		c.lastNanos.Store(now)
		if c.rc != nil {
			if c.rc.st != nil {
				// Once per frame: the last event's cursor, copied into a
				// buffer the client keeps (the frame's is reused).
				c.rc.st.cursor = append(c.rc.st.cursor[:0], eventCursorBytes(lastEvent)...)
			}
			c.rc.caughtUp(c.v.last, now)
		}
	}
	return drop
}

// wireConn is a client's connection as its reader and closers use it,
// whichever WebSocket client carries it: nativeConn (coder/websocket) for
// the native protocol, wsConn (ours) for GraphQL, whose one event per
// message made a general library's per-message cost the client's main cost.
type wireConn interface {
	// ReadMessage blocks until the next message and returns it in a
	// buffer the next call reuses, and its receive time (unix ns);
	// steady-state reads allocate nothing. It takes no context: a
	// cancellable one costs allocations per read, so a watcher
	// (closeOnDone) closes the connection to stop it.
	ReadMessage() (msg []byte, at int64, err error)
	// CloseNormal closes with a normal-closure handshake, bounded.
	CloseNormal(ctx context.Context)
	// CloseNow closes the connection at once, without a handshake.
	CloseNow() error
}

// nativeConn is a native client's coder/websocket connection.
type nativeConn struct {
	*websocket.Conn
	buf bytes.Buffer // the current frame; reused
}

// ReadMessage reads one frame with context.Background(): with a
// cancellable context coder/websocket registers and removes a
// context.AfterFunc on every frame header and payload read, which
// measured 8 allocations (~300 B) per frame against none, plus a lock on
// the parent context that every client shares.
func (n *nativeConn) ReadMessage() ([]byte, int64, error) {
	_, r, err := n.Reader(context.Background())
	if err != nil {
		return nil, 0, err
	}
	n.buf.Reset()
	if _, err := n.buf.ReadFrom(r); err != nil {
		return nil, 0, err
	}
	return n.buf.Bytes(), time.Now().UnixNano(), nil
}

// CloseNormal closes with a normal-closure handshake, bounded by the
// library at 5 s to write + 5 s to hear back.
func (n *nativeConn) CloseNormal(context.Context) {
	_ = n.Close(websocket.StatusNormalClosure, "loadtest done")
}

// closeOnDone closes conn when stop ends. The returned unwatch cancels the
// watch, or, if the close has started, waits for it to finish, so the watcher
// never outlives its reader.
func closeOnDone(ctx, stop context.Context, conn wireConn) (unwatch func()) {
	done := make(chan struct{})
	stopWatch := context.AfterFunc(stop, func() {
		defer close(done)
		closeConn(ctx, conn)
	})
	return func() {
		if !stopWatch() {
			<-done
		}
	}
}

// closeConn closes conn with a normal-closure handshake, bounded, or at
// once, without one, when the caller's ctx has ended and it is no longer
// willing to wait.
func closeConn(ctx context.Context, conn wireConn) {
	if ctx.Err() != nil {
		_ = conn.CloseNow()
		return
	}
	conn.CloseNormal(ctx)
}
