package gateway

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"math/rand/v2"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/fanwire/fanwire/gateway/auth"
	"github.com/fanwire/fanwire/gateway/internal/fanout"
	"github.com/fanwire/fanwire/gateway/internal/filter"
	"github.com/fanwire/fanwire/gateway/internal/netconn"
	"github.com/fanwire/fanwire/gateway/internal/presence"

	"github.com/coder/websocket"
	"go.uber.org/zap"
)

// conn is one WebSocket connection, native or GraphQL (gql set). serve
// runs on a goroutine the Server owns: it is the reader and the owner of
// everything else; an idle reader parks the socket and exits (conn_park.go),
// so an idle connection holds no goroutine. Only the holder of the
// writer's role (writerRunning: a writer goroutine, or a flusher's turn)
// writes to the socket. Pings run on timer goroutines. When reading ends,
// serve stops the writer and any ping, waits for them and unregisters
// everything.
type conn struct {
	s   *Server         // static
	ws  *websocket.Conn // static
	id  string          // static
	cl  *fanout.Client  // static
	pc  presence.Conn   // static: what presence knows of it (its watches and members key on &pc)
	ctx context.Context // static: cancelled when the server stops hard

	gql    *gqlConn             // static: nil for the native protocol
	req    *http.Request        // static: the upgrade request (authentication)
	grants *auth.Grants         // what the connection may subscribe to (nil: everything); set before reading (GraphQL: by connection_init)
	fw     *netconn.FrameWriter // static: the socket's writer (GraphQL frames its messages into it in batches)
	remote string               // static: the client's address, as logs show it (trusted-proxy aware)
	since  time.Time            // static: when the connection was accepted

	// sub is the token's sub ("" without a token), stored whenever grants
	// are set: the inspector (admin.go) reads it from another goroutine.
	sub atomic.Pointer[string]

	closeCode     atomic.Int32           // requested close code; 0 while open. Set once, under mu.
	closeReason   atomic.Pointer[string] // set before closeCode when the winning close request has its own reason
	writeErr      atomic.Bool            // the writer failed
	pingFailed    atomic.Bool            // a ping went unanswered
	writerRunning atomic.Bool            // the writer's role is taken: a writer goroutine exists or a flusher has its turn (see ensureWriter, retire, FlushTurn)
	written       atomic.Uint64          // items written to the socket (compare fanout.Mailbox.Pushes)
	sent          atomic.Uint64          // payload bytes written in frames: added by the writer's role once per frame or batch, never per delivery (the inspector's bytes_sent)
	adminCode     atomic.Int32           // the close code an operator asked for (admin.go); 0: none
	shared        sharedFlush            // the shared flushers' state of it (conn_flush.go)
	stop          chan struct{}          // closed by serve when reading ended: writer and pings exit

	mu       sync.Mutex
	closed   bool           // guarded by mu: no new writer or ping may start
	tasks    sync.WaitGroup // writer and ping goroutines; Add only under mu while !closed
	pingT    *time.Timer    // guarded by mu
	watchdog *time.Timer    // guarded by mu: cuts the socket if a close stalls
	expiry   *time.Timer    // guarded by mu: closes the connection when its token expires

	subsMu sync.Mutex
	subs   map[string]*subState // guarded by subsMu; id → state (the reader adds and removes, resumes mark live or fail)

	runCtx    context.Context    // static: cancelled when reading ends; resumes stop
	cancelRun context.CancelFunc // static

	park  parking // parking its reader (conn_park.go)
	onEnd func()  // static: run last when the connection has ended (the Server's bookkeeping)

	pings pings // one ping at a time (conn_writer.go)

	// owned by serve (the reader)
	rate     tokenBucket
	presRate tokenBucket          // track and untrack (Config.PresenceRate)
	compiles filter.Bucket        // filter texts compiled for it (Config.FilterCompileRate)
	filters  *fanout.FilterBudget // static: what its filtered subscriptions may spend and hold (fanout.FilterBudget)
	errCount int
	errSince time.Time
}

func newConnID() string {
	var b [8]byte
	_, _ = crand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+)
	return hex.EncodeToString(b[:])
}

// requestClose asks the writer to close the connection with code; the first
// request wins. A close that does not complete in CloseTimeout (a peer that
// stopped reading blocks the writer inside a write) cuts the socket.
func (c *conn) requestClose(code int) bool {
	return c.requestCloseReason(code, nil)
}

// requestCloseReason is requestClose with the close's own reason (nil: the
// code's usual one), kept only if this request wins.
func (c *conn) requestCloseReason(code int, reason *string) bool {
	if c.closeCode.Load() != 0 {
		return false
	}
	c.mu.Lock()
	// closed: serve has ended (a late timer callback asks), and nothing
	// would stop a watchdog. closeCode: requests change it only under mu.
	if c.closed || c.closeCode.Load() != 0 {
		c.mu.Unlock()
		return false
	}
	if reason != nil {
		c.closeReason.Store(reason) // before the code: the writer reads it once it sees the code
	}
	c.closeCode.Store(int32(code))
	c.watchdog = time.AfterFunc(c.s.cfg.CloseTimeout, func() { c.closeNow() })
	c.mu.Unlock()
	c.cl.Signal()
	return true
}

// setGrants sets what the connection may do, and its sub for the
// inspector. Called by the reader (or before the connection reads).
func (c *conn) setGrants(g *auth.Grants) {
	c.grants = g
	sub := ""
	if g != nil && !g.Anonymous {
		sub = g.Subject
	}
	c.sub.Store(&sub)
}

// overflow is the hub's callback when this connection's mailbox is full.
func (c *conn) overflow() {
	c.cl.Mailbox.Close()
	if c.requestClose(CloseSlowConsumer) {
		c.s.metrics.SlowConsumers.Inc()
	}
}

// send queues a control message (reply) in order with events.
func (c *conn) send(b []byte) {
	if c.queue(b) {
		c.cl.Signal()
	}
}

// queue queues a control message and reports whether the writer must be
// woken. A full mailbox marks the connection a slow consumer, whose close
// request wakes the writer itself.
func (c *conn) queue(b []byte) (wake bool) {
	if b == nil { // a reply this protocol does not have
		return false
	}
	wasEmpty, err := c.cl.Mailbox.PushControl(fanout.Item{Ev: fanout.NewControl(b)})
	if err != nil {
		c.overflow()
		return false
	}
	return wasEmpty
}

// serve runs the connection until it ends. It returns when the writer has
// exited and the connection is unregistered.
func (c *conn) serve() {
	interval := c.s.cfg.PingInterval
	c.mu.Lock()
	// Spread pings so 10,000 connections don't ping in the same instant.
	c.schedulePingLocked(interval/2 + rand.N(interval/2+1))
	c.mu.Unlock()
	if c.gql == nil {
		c.armExpiry()
		c.send(readyMessage(c.id, c.s.durable != nil, c.s.readyLimits, time.Now()))
	} else {
		c.mu.Lock()
		c.gql.initTimer = time.AfterFunc(c.s.cfg.GraphQLInitTimeout, func() {
			c.closeWith(CloseInitTimeout, "Connection initialisation timeout")
		})
		c.mu.Unlock()
	}
	c.read(true)
}

// read runs a reader: until it parks (a new one starts when the socket is
// readable again) or the connection ends, which it then cleans up. With
// parkFirst it may park before it reads anything.
func (c *conn) read(parkFirst bool) {
	err := c.readLoop(parkFirst)
	if err == errParked {
		return
	}
	c.end(err)
}

// Woken is a reader the idle poller started (idlepark.Conn): the socket
// is readable. What is there may be only pongs (an idle client answering pings): they
// are taken off the socket here and the reader parks again at once,
// because the library's Read would take them and then wait, goroutine
// and all, for a data message that may not come for hours.
func (c *conn) Woken() {
	c.park.gate.Lock()
	skimmed := !c.park.closing && c.closeCode.Load() == 0 && c.skimPongs()
	c.park.gate.Unlock()
	if skimmed && c.tryPark() {
		return
	}
	c.read(false)
}

// tryPark parks the reader if the library's reader is empty and the
// connection is not closing; on true the caller returns at once.
func (c *conn) tryPark() bool {
	if c.park.br == nil {
		return false
	}
	c.park.gate.Lock()
	defer c.park.gate.Unlock()
	if c.park.closing || c.closeCode.Load() != 0 || c.park.br.Buffered() != 0 || c.park.prefix != nil && !c.park.prefix.Reached.Load() {
		return false
	}
	return c.s.idle.Park(c)
}

// wakeReader starts a reader for c if it is parked: a closer calls it
// after closing the socket, so that the connection ends and is cleaned up
// as it would be by a reader that was blocked in a read.
func (c *conn) wakeReader() {
	if c.s.idle.Unpark(c) {
		go c.read(false)
	}
}

// end stops the writer and pings, waits for them and unregisters
// everything, once reading has ended with err.
func (c *conn) end(err error) {
	close(c.stop)
	c.cancelRun()
	c.mu.Lock()
	c.closed = true
	if c.pingT != nil {
		c.pingT.Stop()
	}
	if c.watchdog != nil {
		c.watchdog.Stop()
	}
	if c.gql != nil && c.gql.initTimer != nil {
		c.gql.initTimer.Stop()
	}
	if c.expiry != nil {
		c.expiry.Stop()
	}
	c.mu.Unlock()
	_ = c.ws.CloseNow() // ends a write or a ping in flight
	c.tasks.Wait()      // writer, pings, resumes and feeds
	c.subsMu.Lock()
	var feeds []*feedState
	for id, st := range c.subs {
		if st.live {
			switch {
			case st.watchOnly: // pres.leaveAll below unwatches it
			case st.view != nil:
				c.s.hub.RemoveView(st.view, nil)
			case st.feed == nil:
				c.s.hub.Unsubscribe(c.cl, id, st.pattern, nil)
			}
			c.s.metrics.Subscriptions.Dec()
		}
		if st.feed != nil {
			feeds = append(feeds, st.feed)
		}
	}
	c.subsMu.Unlock()
	if len(feeds) > 0 { // every write is over: acknowledge what was written
		ctx, cancel := context.WithTimeout(context.Background(), feedEndTimeout)
		for _, f := range feeds {
			c.endFeed(ctx, f, false)
		}
		cancel()
	}
	c.s.pres.LeaveAll(&c.pc) // its memberships and presence watches
	c.cl.Mailbox.Close()
	reason := c.disconnectReason(err)
	c.s.metrics.Disconnects.WithLabelValues(reason).Inc()
	if ce := c.s.log.Check(zap.DebugLevel, "connection closed"); ce != nil {
		ce.Write(zap.String("conn", c.id), zap.String("reason", reason), zap.Error(err))
	}
	if c.onEnd != nil {
		c.onEnd()
	}
}

func (c *conn) disconnectReason(readErr error) string {
	if code := c.closeCode.Load(); code != 0 && code == c.adminCode.Load() {
		return "admin"
	}
	switch c.closeCode.Load() {
	case CloseGoingAway:
		return "shutdown"
	case CloseSlowConsumer:
		return "slow_consumer"
	case ClosePolicy:
		return "policy"
	case CloseTokenExpired:
		return "token_expired"
	case CloseInvalidUTF8:
		return "invalid_utf8"
	case CloseInitTimeout:
		return "init_timeout"
	case CloseForbidden:
		return "unauthorized"
	case CloseBadRequest, CloseUnauthorized, CloseSubscriberExists, CloseTooManyInitialise:
		return "protocol_error"
	}
	switch {
	// First: the library closed with 1009 from the reader, and a write or
	// ping failing after that is its consequence (the writer's "ready"
	// could lose that race and count a 1009 as write_error).
	case errors.Is(readErr, websocket.ErrMessageTooBig):
		return "read_limit"
	case c.pingFailed.Load():
		return "ping_timeout"
	case c.writeErr.Load():
		return "write_error"
	}
	return "client"
}

func (c *conn) readLoop(parkFirst bool) error {
	for park := parkFirst; ; park = true {
		// All the client sent is handled: park rather than wait in a read
		// (conn_park.go). The library's reader must be empty: the poller
		// sees only the socket. A reader woken by the poller reads first.
		if park && c.tryPark() {
			return errParked
		}
		typ, data, err := c.ws.Read(c.ctx)
		if err != nil {
			return err
		}
		if c.closeCode.Load() != 0 {
			continue // closing: read on until the peer's close frame, act on nothing
		}
		if typ == websocket.MessageText && !utf8.Valid(data) {
			// RFC 6455 §8.1: a text message that is not UTF-8 fails the
			// connection. The websocket library does not check, and
			// encoding/json would quietly turn the bad bytes into U+FFFD
			// and act on a message the client did not send.
			c.closeWith(CloseInvalidUTF8, "text message is not valid UTF-8")
			continue
		}
		if !c.admit(data) {
			continue
		}
		if c.gql != nil {
			c.gqlHandle(typ == websocket.MessageText, data)
			continue
		}
		if typ != websocket.MessageText {
			c.clientError("", CodeBadFrame, "binary frames are not supported; send JSON text frames")
			continue
		}
		c.handle(data)
	}
}

// finish closes the connection with code. Going away (1001) and policy
// (1008) first deliver what is queued (drain, then close); a slow consumer's
// mailbox was discarded.
func (c *conn) finish(code int) {
	reason := "server going away"
	switch r := c.closeReason.Load(); {
	case r != nil: // the request's own (GraphQL's rate limit has one for 1008)
		reason = *r
	case code == CloseSlowConsumer:
		reason = "slow consumer"
	case code == ClosePolicy:
		reason = "too many protocol errors"
	}
	if code != CloseSlowConsumer {
		if !c.drain() {
			return
		}
	}
	// Close does the handshake; the reader receives the peer's close frame.
	c.park.gate.Lock()
	c.park.closing = true
	c.park.gate.Unlock()
	_ = c.ws.Close(websocket.StatusCode(code), reason)
	c.wakeReader()
}

// closeWith asks the writer to close with code and reason; the reader
// ignores everything after it.
func (c *conn) closeWith(code int, reason string) {
	reason = closeReason(reason)
	c.requestCloseReason(code, &reason)
}

// maxCloseReason is the longest close reason a control frame can carry.
const maxCloseReason = 123

// closeNow cuts the socket and wakes a parked reader to end the connection.
func (c *conn) closeNow() {
	_ = c.ws.CloseNow()
	c.wakeReader()
}

// closeReason cuts reason to what a close frame carries, on a UTF-8
// boundary.
func closeReason(reason string) string {
	if len(reason) > maxCloseReason {
		reason = reason[:maxCloseReason]
		for !utf8.ValidString(reason) {
			reason = reason[:len(reason)-1]
		}
	}
	return reason
}
