package gateway

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"math/rand/v2"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
	"go.uber.org/zap"
)

// conn is one native-protocol WebSocket connection. The HTTP handler's
// goroutine runs serve, which is the reader and the owner: it starts the
// writer, and when reading ends it stops the writer, waits for it and
// unregisters everything. The writer is the only goroutine that writes to
// the socket (one writer per socket).
type conn struct {
	s   *Server         // static
	ws  *websocket.Conn // static
	id  string          // static
	cl  *client         // static
	log *zap.Logger     // static
	ctx context.Context // static: cancelled when the server stops hard

	closeCode  atomic.Int32   // requested close code; 0 while open. Set once.
	writeErr   atomic.Bool    // the writer failed
	pingFailed atomic.Bool    // a ping went unanswered
	pinging    atomic.Bool    // a ping is in flight
	pings      sync.WaitGroup // the in-flight ping's goroutine; waited for by serve
	stop       chan struct{}  // closed by serve when reading ended: the writer exits
	writerDone chan struct{}  // closed by the writer

	watchdogMu sync.Mutex
	watchdog   *time.Timer // guarded by watchdogMu: cuts the socket if a close stalls

	// owned by serve (the reader)
	subs     map[string]string // id → pattern
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
func (c *conn) requestClose(code int) {
	if !c.closeCode.CompareAndSwap(0, int32(code)) {
		return
	}
	c.watchdogMu.Lock()
	c.watchdog = time.AfterFunc(c.s.cfg.CloseTimeout, func() { _ = c.ws.CloseNow() })
	c.watchdogMu.Unlock()
	c.cl.signal()
}

// overflow is the hub's callback when this connection's mailbox is full.
func (c *conn) overflow() {
	c.cl.mb.close()
	c.requestClose(CloseSlowConsumer)
}

// send queues a control message (reply) in order with events.
func (c *conn) send(b []byte) {
	wasEmpty, err := c.cl.mb.pushControl(item{ev: controlMessage(b)})
	if err != nil {
		c.overflow()
		return
	}
	if wasEmpty {
		c.cl.signal()
	}
}

// serve runs the connection until it ends. It returns when the writer has
// exited and the connection is unregistered.
func (c *conn) serve() {
	go c.writeLoop()
	c.send(readyMessage(c.id))
	err := c.readLoop()

	close(c.stop)
	<-c.writerDone
	_ = c.ws.CloseNow() // also ends a ping in flight
	c.pings.Wait()
	c.watchdogMu.Lock()
	if c.watchdog != nil {
		c.watchdog.Stop()
	}
	c.watchdogMu.Unlock()
	for id, pattern := range c.subs {
		c.s.hub.idx.remove(c.cl, id, pattern)
	}
	c.s.metrics.Subscriptions.Sub(float64(len(c.subs)))
	c.cl.mb.close()
	reason := c.disconnectReason(err)
	c.s.metrics.Disconnects.WithLabelValues(reason).Inc()
	c.log.Debug("connection closed", zap.String("reason", reason), zap.Error(err))
}

func (c *conn) disconnectReason(readErr error) string {
	switch c.closeCode.Load() {
	case CloseGoingAway:
		return "shutdown"
	case CloseSlowConsumer:
		return "slow_consumer"
	case ClosePolicy:
		return "policy"
	}
	switch {
	case c.pingFailed.Load():
		return "ping_timeout"
	case c.writeErr.Load():
		return "write_error"
	case errors.Is(readErr, websocket.ErrMessageTooBig): // the library sent 1009
		return "read_limit"
	}
	return "client"
}

func (c *conn) readLoop() error {
	for {
		typ, data, err := c.ws.Read(c.ctx)
		if err != nil {
			return err
		}
		if typ != websocket.MessageText {
			c.clientError("", CodeBadFrame, "binary frames are not supported; send JSON text frames")
			continue
		}
		c.handle(data)
	}
}

func (c *conn) handle(data []byte) {
	f, err := parseClientFrame(data)
	if err != nil {
		code := CodeBadFrame
		if errors.Is(err, ErrUnknownType) {
			code = CodeUnknownType
		}
		id := ""
		if f.ID != nil && len(*f.ID) <= maxIDLen {
			id = *f.ID
		}
		c.clientError(id, code, err.Error())
		return
	}
	switch f.Type {
	case "subscribe":
		c.subscribe(*f.ID, *f.Subject)
	case "unsubscribe":
		c.unsubscribe(*f.ID)
	case "ping":
		c.send(pongMessage)
	}
}

func (c *conn) subscribe(id, pattern string) {
	if _, dup := c.subs[id]; dup {
		c.clientError(id, CodeDuplicateID, "subscription id "+id+" is already active")
		return
	}
	if len(c.subs) >= c.s.cfg.MaxSubscriptions {
		c.clientError(id, CodeTooManySubscriptions, "at most "+strconv.Itoa(c.s.cfg.MaxSubscriptions)+" subscriptions per connection")
		return
	}
	if err := c.s.checkPattern(pattern); err != nil {
		c.clientError(id, CodeBadPattern, err.Error())
		return
	}
	// The reply is queued before the subscription becomes visible to the
	// dispatcher, so no event for it can precede "subscribed".
	c.send(replyMessage("subscribed", id))
	c.subs[id] = pattern
	c.s.hub.idx.add(c.cl, id, pattern)
	c.s.metrics.Subscriptions.Inc()
}

func (c *conn) unsubscribe(id string) {
	pattern, ok := c.subs[id]
	if !ok {
		c.clientError(id, CodeUnknownID, "no active subscription with id "+id)
		return
	}
	// Removed before the reply is queued: once the dispatcher's current
	// batch is done no event lists this id, and "unsubscribed" follows every
	// event that did.
	c.s.hub.idx.remove(c.cl, id, pattern)
	delete(c.subs, id)
	c.s.metrics.Subscriptions.Dec()
	c.send(replyMessage("unsubscribed", id))
}

// clientError reports a protocol error to the client. A client error never
// closes the connection, but more than MaxClientErrors of them within
// ErrorWindow is abuse: the connection is closed with 1008.
func (c *conn) clientError(id, code, msg string) {
	c.s.metrics.ClientErrors.WithLabelValues(code).Inc()
	now := time.Now()
	if now.Sub(c.errSince) > c.s.cfg.ErrorWindow {
		c.errSince, c.errCount = now, 0
	}
	c.errCount++
	c.send(errorMessage(id, code, msg))
	if c.errCount > c.s.cfg.MaxClientErrors {
		c.requestClose(ClosePolicy)
	}
}

// writeLoop is the connection's only writer. Woken by the dispatcher (once
// per batch) or a reply, it yields once so that more deliveries pile up,
// then drains the mailbox into as few frames as MaxFrameBytes allows.
func (c *conn) writeLoop() {
	defer close(c.writerDone)
	interval := c.s.cfg.PingInterval
	// Spread pings so 10,000 connections don't ping in the same instant.
	ping := time.NewTimer(interval/2 + rand.N(interval/2+1))
	defer ping.Stop()
	for {
		select {
		case <-c.cl.wake:
		case <-ping.C:
			// The ping runs beside the writer: waiting for the pong here
			// would stop deliveries for a round trip behind everything the
			// client has not read yet, and fill the mailbox meanwhile.
			if c.pinging.CompareAndSwap(false, true) {
				c.pings.Go(c.ping)
			}
			ping.Reset(interval)
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
		b.release()
		if err != nil {
			c.writeErr.Store(true)
			_ = c.ws.CloseNow() // ends the reader too
			return false
		}
		if c.closeCode.Load() != 0 {
			return true
		}
	}
}

// writeBatch splices the batch's items into frames of at most MaxFrameBytes
// (a single larger message gets a frame of its own), '\n'-separated, one
// Write each.
func (c *conn) writeBatch(bt *batch) error {
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
func (c *conn) ping() {
	defer c.pinging.Store(false)
	ctx, cancel := context.WithTimeout(c.ctx, c.s.cfg.PingTimeout)
	defer cancel()
	if err := c.ws.Ping(ctx); err != nil {
		select {
		case <-c.stop: // the connection was ending anyway
		default:
			c.pingFailed.Store(true)
		}
		_ = c.ws.CloseNow()
	}
}

// finish closes the connection with code. Going away (1001) and policy
// (1008) first deliver what is queued (drain, then close); a slow consumer's
// mailbox was discarded.
func (c *conn) finish(code int) {
	reason := "server going away"
	switch code {
	case CloseSlowConsumer:
		reason = "slow consumer"
	case ClosePolicy:
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
