package gateway

import (
	"context"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
	"github.com/fanwire/fanwire/gateway/internal/fanout"
)

// A connection's writer and its pings: the one goroutine that writes to the
// socket, started on demand when the mailbox is woken and retired when
// idle, which builds frames from the mailbox's batches and sends pings.

// writerLinger is how long a writer waits for more work before it exits.
const writerLinger = 2 * time.Second

// ensureWriter is the client's wake hook, called after every wake signal:
// it starts a writer if none is running, or queues the connection on its
// flusher (conn_flush.go). The fast path is one atomic load.
func (c *conn) ensureWriter() {
	if c.writerRunning.Load() {
		return
	}
	if c.shared.pool != nil {
		c.shared.pool.Enqueue(c)
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
	case <-c.cl.Wake:
		if c.writerRunning.CompareAndSwap(false, true) {
			c.cl.Signal() // put the wake back for this writer's loop
			return false
		}
		c.cl.Signal() // the writer that took over gets it
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
		case <-c.cl.Wake:
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
		b := c.cl.Mailbox.Take()
		if b.Len() == 0 {
			return true
		}
		err := c.writeBatch(&b)
		n := b.Len()
		b.Release()
		if err != nil {
			c.writeErr.Store(true)
			c.closeNow() // ends the reader too
			return false
		}
		c.written.Add(uint64(n))
		if c.closeCode.Load() != 0 {
			return true
		}
	}
}

// writeBatch splices the batch's items into frames of at most MaxFrameBytes
// (a single larger message gets a frame of its own), '\n'-separated, one
// Write each.
func (c *conn) writeBatch(bt *fanout.Batch) error {
	if c.gql != nil {
		return c.writeBatchGQL(bt)
	}
	bp := getFrameBuf()
	defer putFrameBuf(bp)
	buf := (*bp)[:0]
	limit := c.s.cfg.MaxFrameBytes
	for s := bt.First(); s != nil; s = bt.Next(s) {
		for _, it := range bt.Used(s) {
			if len(buf) > 0 && len(buf)+1+it.Size() > limit {
				if err := c.writeFrame(buf); err != nil {
					return err
				}
				buf = buf[:0]
			}
			if len(buf) > 0 {
				buf = append(buf, '\n')
			}
			buf = it.AppendTo(buf)
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
	c.sent.Add(uint64(len(b)))
	return nil
}

// ping sends a ping and waits for its pong; an unanswered ping cuts the
// connection (the reader then ends and serve cleans up). The ping is
// written between the library's frames (netconn.FrameWriter.WritePing) and its
// pong recognised by its payload, whichever way it is read: by the
// library (OnPongReceived) or, while the reader is parked, by the woken
// reader before it hands the socket back to the library (skimPongs).
func (c *conn) ping() bool {
	seq := c.pings.seq.Add(1)
	var payload [20]byte
	p := strconv.AppendUint(payload[:0], seq, 10)
	select { // a pong to an earlier ping that came late must not count
	case <-c.pings.pong:
	default:
	}
	c.pings.pending.Store(seq)
	// The timeout covers the write too: a write stuck on a full socket is
	// cut with the rest. Whoever takes pings.pending from seq to 0 (the pong,
	// the timeout, a failed write) decides.
	fail := func() {
		select {
		case <-c.stop: // the connection was ending anyway
		default:
			c.pingFailed.Store(true)
		}
		c.closeNow()
	}
	expired := make(chan struct{})
	t := time.AfterFunc(c.s.cfg.PingTimeout, func() {
		if c.pings.pending.CompareAndSwap(seq, 0) {
			fail()
		}
		close(expired)
	})
	defer t.Stop()
	ok, err := c.fw.WritePing(p)
	for tries := 0; !ok && err == nil && tries < 100 && c.closeCode.Load() == 0; tries++ {
		runtime.Gosched() // a library frame (a pong, a close) is partway through
		ok, err = c.fw.WritePing(p)
	}
	switch {
	case err != nil:
		if c.pings.pending.CompareAndSwap(seq, 0) {
			fail()
		}
		return false
	case !ok: // closing (the close handshake takes over), or the socket busy with the library's frames: next time
		c.pings.pending.CompareAndSwap(seq, 0)
		return c.closeCode.Load() == 0
	}
	select {
	case <-c.pings.pong:
		return true
	case <-expired:
		return false
	case <-c.stop:
		c.pings.pending.CompareAndSwap(seq, 0)
		return false
	}
}

// onPong takes a pong: the one the pending ping waits for ends its wait.
func (c *conn) onPong(payload []byte) {
	seq, err := strconv.ParseUint(string(payload), 10, 64)
	if err != nil || seq == 0 || !c.pings.pending.CompareAndSwap(seq, 0) {
		return // unsolicited (RFC 6455 allows it) or late
	}
	select {
	case c.pings.pong <- struct{}{}:
	default:
	}
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

// pings is a connection's ping in flight: one at a time.
type pings struct {
	seq     atomic.Uint64 // the last ping's number, its payload in decimal
	pending atomic.Uint64 // the ping waiting for its pong
	pong    chan struct{} // static, buffered 1: the pending ping's pong came
}
