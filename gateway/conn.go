package gateway

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"math/rand/v2"
	"net/http"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/coder/websocket"
	"go.uber.org/zap"
)

// conn is one native-protocol WebSocket connection. serve runs on a
// goroutine the Server owns: it is the reader and the owner of everything
// else. The writer is the only goroutine that writes to the socket (one
// writer per socket); it runs only while there is something to write, plus
// writerLinger, so an idle connection costs one goroutine, not two. Pings
// run on timer goroutines. When reading ends, serve stops the writer and any
// ping, waits for them and unregisters everything.
type conn struct {
	s   *Server         // static
	ws  *websocket.Conn // static
	id  string          // static
	cl  *client         // static
	ctx context.Context // static: cancelled when the server stops hard

	gql    *gqlConn      // static: nil for the native protocol
	req    *http.Request // static: the upgrade request (authentication)
	grants *Grants       // what the connection may subscribe to (nil: everything); set before reading (GraphQL: by connection_init)
	fw     *frameWriter  // static: the socket's writer (GraphQL frames its messages into it in batches)

	closeCode     atomic.Int32           // requested close code; 0 while open. Set once, under mu.
	closeReason   atomic.Pointer[string] // set before closeCode when the winning close request has its own reason
	writeErr      atomic.Bool            // the writer failed
	pingFailed    atomic.Bool            // a ping went unanswered
	writerRunning atomic.Bool            // a writer goroutine exists (see ensureWriter, retire)
	written       atomic.Uint64          // items written to the socket (compare mailbox.pushes)
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

	// owned by serve (the reader)
	rate     tokenBucket
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
	c.watchdog = time.AfterFunc(c.s.cfg.CloseTimeout, func() { _ = c.ws.CloseNow() })
	c.mu.Unlock()
	c.cl.signal()
	return true
}

// writerLinger is how long a writer waits for more work before it exits.
const writerLinger = 2 * time.Second

// ensureWriter is the client's wake hook, called after every wake signal:
// it starts a writer if none is running. The fast path is one atomic load.
func (c *conn) ensureWriter() {
	if c.writerRunning.Load() {
		return
	}
	c.mu.Lock()
	if !c.closed && c.writerRunning.CompareAndSwap(false, true) {
		c.tasks.Add(1)
		go c.writeLoop()
	}
	c.mu.Unlock()
}

// retire ends an idle writer. It first clears writerRunning, then looks for
// a wake that raced with it: a waker either sees writerRunning false (and
// starts a writer) or left its signal for this check. It reports whether
// the writer may exit.
func (c *conn) retire() bool {
	c.writerRunning.Store(false)
	select {
	case <-c.cl.wake:
		if c.writerRunning.CompareAndSwap(false, true) {
			c.cl.signal() // put the wake back for this writer's loop
			return false
		}
		c.cl.signal() // the writer that took over gets it
		return true
	default:
		return true
	}
}

// schedulePingLocked arms the next ping; c.mu is held.
func (c *conn) schedulePingLocked(d time.Duration) {
	if c.closed {
		return
	}
	if c.pingT == nil {
		c.pingT = time.AfterFunc(d, c.pingTick)
		return
	}
	c.pingT.Reset(d)
}

// pingTick runs on the timer's goroutine. The ping runs beside the writer:
// waiting for the pong in the writer would stop deliveries for a round trip
// behind everything the client has not read yet, and fill the mailbox.
func (c *conn) pingTick() {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	c.tasks.Add(1)
	c.mu.Unlock()
	defer c.tasks.Done()
	if !c.ping() {
		return
	}
	c.mu.Lock()
	c.schedulePingLocked(c.s.cfg.PingInterval)
	c.mu.Unlock()
}

// overflow is the hub's callback when this connection's mailbox is full.
func (c *conn) overflow() {
	c.cl.mb.close()
	if c.requestClose(CloseSlowConsumer) {
		c.s.metrics.SlowConsumers.Inc()
	}
}

// send queues a control message (reply) in order with events.
func (c *conn) send(b []byte) {
	if c.queue(b) {
		c.cl.signal()
	}
}

// queue queues a control message and reports whether the writer must be
// woken. A full mailbox marks the connection a slow consumer, whose close
// request wakes the writer itself.
func (c *conn) queue(b []byte) (wake bool) {
	if b == nil { // a reply this protocol does not have
		return false
	}
	wasEmpty, err := c.cl.mb.pushControl(item{ev: controlMessage(b)})
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
		c.send(readyMessage(c.id, c.s.durable != nil))
	} else {
		c.mu.Lock()
		c.gql.initTimer = time.AfterFunc(c.s.cfg.GraphQLInitTimeout, func() {
			c.closeWith(CloseInitTimeout, "Connection initialisation timeout")
		})
		c.mu.Unlock()
	}
	err := c.readLoop()

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
			if st.feed == nil {
				c.s.hub.idx.remove(c.cl, id, st.pattern)
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
	c.cl.mb.close()
	reason := c.disconnectReason(err)
	c.s.metrics.Disconnects.WithLabelValues(reason).Inc()
	if ce := c.s.log.Check(zap.DebugLevel, "connection closed"); ce != nil {
		ce.Write(zap.String("conn", c.id), zap.String("reason", reason), zap.Error(err))
	}
}

func (c *conn) disconnectReason(readErr error) string {
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

func (c *conn) readLoop() error {
	for {
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

// admit counts a client message against MaxMessageRate; one over it is
// reported (rate_limited, with the message's id when it has one; GraphQL:
// close 1008) and must be dropped. data is the message (nil for a
// WebSocket ping). Called by the reader only.
func (c *conn) admit(data []byte) bool {
	if c.rate.allow(time.Now(), c.s.cfg.MaxMessageRate) {
		return true
	}
	if c.gql != nil { // the protocol has no error without an operation
		c.s.metrics.ClientErrors.WithLabelValues(CodeRateLimited).Inc()
		c.closeWith(ClosePolicy, "message rate over the limit")
		return false
	}
	var id string
	if data != nil {
		id = frameID(data)
	}
	c.clientError(id, CodeRateLimited, "over "+strconv.Itoa(c.s.cfg.MaxMessageRate)+" messages per second: this one was dropped")
	return false
}

// onPing is the websocket library's callback for a client's WebSocket
// ping; it reports whether to answer with a pong. A ping is a client
// message like any other: over MaxMessageRate it gets no pong and counts
// as rate_limited, so a ping flood costs a read per ping, not a write,
// and soon closes the connection (1008) like any flood. The library calls
// it inside Read, on the reader, except while Close waits for the peer's
// close frame (on the writer, after a close was requested): then it
// touches nothing of the reader's and sends no more pongs.
func (c *conn) onPing(context.Context, []byte) bool {
	return c.closeCode.Load() == 0 && c.admit(nil)
}

func (c *conn) handle(data []byte) {
	f, err := parseClientFrame(data)
	if err != nil {
		id, code := errorReply(f, err)
		c.clientError(id, code, err.Error())
		return
	}
	switch f.Type {
	case "subscribe":
		c.subscribe(*f.ID, *f.Subject, f.From, f.Durable)
	case "unsubscribe":
		c.unsubscribe(*f.ID)
	case "ping":
		c.send(pongMessage)
	case "refresh":
		c.refresh(deref(f.ID), *f.Token)
	case "publish":
		c.publish(*f.ID, *f.Subject, f.Data)
	}
}

// refresh replaces the connection's token: its grants apply from now on,
// and its expiry moves. A refused token is an error (code unauthorized);
// the connection keeps its old token until that expires. id (may be
// empty) is the refresh's, echoed in the reply.
func (c *conn) refresh(id, token string) {
	auth := c.s.cfg.Authenticate
	if auth == nil {
		c.clientError(id, CodeUnauthorized, "this gateway does not authenticate connections: nothing to refresh")
		return
	}
	payload, _ := json.Marshal(map[string]string{"token": token})
	grants, err := auth(c.runCtx, c.req, payload)
	if err != nil {
		c.clientError(id, CodeUnauthorized, err.Error())
		return
	}
	c.grants = grants
	c.armExpiry()
	var exp time.Time
	if grants != nil {
		exp = grants.Expires
	}
	c.send(refreshedMessage(id, exp))
}

// armExpiry (re)starts the timer that closes the connection with 4001 when
// its token expires. The reader calls it (start, connection_init, refresh).
func (c *conn) armExpiry() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.expiry != nil {
		c.expiry.Stop()
		c.expiry = nil
	}
	if c.grants == nil || c.grants.Expires.IsZero() || c.closed {
		return
	}
	c.expiry = time.AfterFunc(time.Until(c.grants.Expires), func() {
		c.closeWith(CloseTokenExpired, "token expired: reconnect with a new one")
	})
}

func (c *conn) subscribe(id, pattern string, from, durable *string) {
	c.subsMu.Lock()
	_, dup := c.subs[id]
	n := len(c.subs)
	c.subsMu.Unlock()
	if dup {
		c.clientError(id, CodeDuplicateID, "subscription id "+id+" is already active")
		return
	}
	if n >= c.s.cfg.MaxSubscriptions {
		c.clientError(id, CodeTooManySubscriptions, "at most "+strconv.Itoa(c.s.cfg.MaxSubscriptions)+" subscriptions per connection")
		return
	}
	if err := c.s.checkPattern(pattern); err != nil {
		c.clientError(id, CodeBadPattern, err.Error())
		return
	}
	if !c.grants.Allows(pattern) {
		c.clientError(id, CodeForbidden, "this connection's token does not grant "+strconv.Quote(pattern))
		return
	}
	if durable != nil || c.s.cfg.Consumer == ConsumerPerConnection {
		c.startFeed(id, pattern, from, durable)
		return
	}
	if from != nil {
		c.startResume(id, pattern, *from)
		return
	}
	st := &subState{pattern: pattern, live: true}
	c.subsMu.Lock()
	c.subs[id] = st
	c.subsMu.Unlock()
	// The reply is queued while the index is held: no event for the
	// subscription can precede it, the client cannot see it before the
	// subscription is live, and the cursor it carries (durable brokers) is
	// exactly the last event dispatched before it.
	var wake bool
	c.s.hub.idx.addThen(c.cl, id, pattern, func() {
		wake = c.queue(c.subscribedMsg(id, c.s.hub.lastCursor()))
	})
	if wake {
		c.cl.signal()
	}
	c.s.metrics.Subscriptions.Inc()
}

func (c *conn) unsubscribe(id string) {
	c.subsMu.Lock()
	st, ok := c.subs[id]
	c.subsMu.Unlock()
	if !ok {
		c.clientError(id, CodeUnknownID, "no active subscription with id "+id)
		return
	}
	if st.task != nil { // a replay or a feed: stop it first
		st.task.cancel()
		<-st.task.done
	}
	c.subsMu.Lock()
	delete(c.subs, id)
	live := st.live
	c.subsMu.Unlock()
	var wake bool
	if st.feed != nil {
		ctx, cancel := context.WithTimeout(context.Background(), feedEndTimeout)
		c.endFeed(ctx, st.feed, true)
		cancel()
		if live {
			c.s.metrics.Subscriptions.Dec()
		}
		wake = c.queue(c.unsubscribedMsg(id))
	} else if live {
		// The reply is queued while the index is held: it follows every
		// event that lists the id, and none follows it.
		c.s.hub.idx.removeThen(c.cl, id, st.pattern, func() { wake = c.queue(c.unsubscribedMsg(id)) })
		c.s.metrics.Subscriptions.Dec()
	} else {
		wake = c.queue(c.unsubscribedMsg(id))
	}
	if wake {
		c.cl.signal()
	}
}

// tokenBucket limits a connection's message rate: rate per second, with a
// burst of twice that. Owned by the reader.
type tokenBucket struct {
	tokens float64
	last   time.Time
}

// allow takes a token; rate <= 0 means no limit.
func (b *tokenBucket) allow(now time.Time, rate int) bool {
	if rate <= 0 {
		return true
	}
	burst := float64(2 * rate)
	if b.last.IsZero() {
		b.tokens = burst
	} else {
		b.tokens = min(burst, b.tokens+now.Sub(b.last).Seconds()*float64(rate))
	}
	b.last = now
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}

// clientError reports a protocol error to the client. A client error never
// closes the connection, but more than MaxClientErrors of them within
// ErrorWindow is abuse: the connection is closed with 1008.
func (c *conn) clientError(id, code, msg string) {
	c.sendClientError(code, c.errorMsg(id, code, msg))
}

// sendClientError counts a client error with code and sends its message b;
// past MaxClientErrors within ErrorWindow the connection is closed with
// 1008. Called by the reader only.
func (c *conn) sendClientError(code string, b []byte) {
	c.s.metrics.ClientErrors.WithLabelValues(code).Inc()
	now := time.Now()
	if now.Sub(c.errSince) > c.s.cfg.ErrorWindow {
		c.errSince, c.errCount = now, 0
	}
	c.errCount++
	c.send(b)
	if c.errCount > c.s.cfg.MaxClientErrors {
		c.requestClose(ClosePolicy)
	}
}

// writeLoop is the connection's only writer. Woken by the dispatcher (once
// per batch) or a reply, it yields once so that more deliveries pile up,
// then drains the mailbox into as few frames as MaxFrameBytes allows. After
// writerLinger without work it exits; ensureWriter starts a new one.
func (c *conn) writeLoop() {
	defer c.tasks.Done()
	idle := time.NewTimer(writerLinger)
	defer idle.Stop()
	for {
		select {
		case <-c.cl.wake:
		case <-idle.C:
			if c.retire() {
				return
			}
			idle.Reset(writerLinger)
			continue
		case <-c.stop:
			return
		}
		if code := c.closeCode.Load(); code != 0 {
			c.finish(int(code))
			return
		}
		runtime.Gosched()
		if !c.drain() {
			return
		}
		if code := c.closeCode.Load(); code != 0 {
			c.finish(int(code))
			return
		}
		idle.Reset(writerLinger)
	}
}

// drain writes everything queued, repeating until the mailbox is empty. It
// returns false if a write failed.
func (c *conn) drain() bool {
	for {
		b := c.cl.mb.take()
		if b.n == 0 {
			return true
		}
		err := c.writeBatch(&b)
		n := b.n
		b.release()
		if err != nil {
			c.writeErr.Store(true)
			_ = c.ws.CloseNow() // ends the reader too
			return false
		}
		c.written.Add(uint64(n))
		if c.closeCode.Load() != 0 {
			return true
		}
	}
}

// subscribedMsg is the reply to a subscribe (none in GraphQL).
func (c *conn) subscribedMsg(id, cursor string) []byte {
	if c.gql != nil {
		return nil
	}
	return subscribedMessage(id, cursor)
}

// unsubscribedMsg is the reply to an unsubscribe (none in GraphQL: the
// client's complete needs no answer).
func (c *conn) unsubscribedMsg(id string) []byte {
	if c.gql != nil {
		return nil
	}
	return replyMessage("unsubscribed", id)
}

// errorMsg is a client error: in GraphQL it ends operation id (an error
// without an id is a protocol error, which closes the connection instead).
func (c *conn) errorMsg(id, code, msg string) []byte {
	if c.gql == nil {
		return errorMessage(id, code, msg)
	}
	c.gql.forget(id)
	return c.gql.errorMessage(id, code, msg)
}

// writeBatch splices the batch's items into frames of at most MaxFrameBytes
// (a single larger message gets a frame of its own), '\n'-separated, one
// Write each.
func (c *conn) writeBatch(bt *batch) error {
	if c.gql != nil {
		return c.writeBatchGQL(bt)
	}
	bp := getFrameBuf()
	defer putFrameBuf(bp)
	buf := (*bp)[:0]
	limit := c.s.cfg.MaxFrameBytes
	for s := bt.head; s != nil; s = bt.next(s) {
		for _, it := range bt.used(s) {
			if len(buf) > 0 && len(buf)+1+it.size() > limit {
				if err := c.writeFrame(buf); err != nil {
					return err
				}
				buf = buf[:0]
			}
			if len(buf) > 0 {
				buf = append(buf, '\n')
			}
			buf = it.appendTo(buf)
		}
	}
	err := c.writeFrame(buf)
	*bp = buf
	return err
}

func (c *conn) writeFrame(b []byte) error {
	// context.Background: a per-write deadline would arm a timer per frame
	// and close the whole connection when it fires; stuck peers are cut by
	// the ping timeout and the close watchdog instead.
	if err := c.ws.Write(context.Background(), websocket.MessageText, b); err != nil {
		return err
	}
	c.s.metrics.Frames.Inc()
	c.s.metrics.BytesSent.Add(float64(len(b)))
	return nil
}

// ping sends a ping and waits for the pong; an unanswered ping cuts the
// connection (the reader then ends and serve cleans up).
func (c *conn) ping() bool {
	ctx, cancel := context.WithTimeout(c.ctx, c.s.cfg.PingTimeout)
	defer cancel()
	if err := c.ws.Ping(ctx); err != nil {
		select {
		case <-c.stop: // the connection was ending anyway
		default:
			c.pingFailed.Store(true)
		}
		_ = c.ws.CloseNow()
		return false
	}
	return true
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
	_ = c.ws.Close(websocket.StatusCode(code), reason)
}

var frameBufPool = sync.Pool{New: func() any { b := make([]byte, 0, 64<<10); return &b }}

func getFrameBuf() *[]byte { return frameBufPool.Get().(*[]byte) }

// putFrameBuf returns a frame buffer; oversized ones (one huge event) are
// left to the GC so the pool's buffers stay frame-sized.
func putFrameBuf(b *[]byte) {
	if cap(*b) > 1<<20 {
		return
	}
	*b = (*b)[:0]
	frameBufPool.Put(b)
}
