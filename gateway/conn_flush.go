package gateway

import (
	"sync/atomic"

	"github.com/fanwire/fanwire/gateway/internal/fanout"
	"github.com/fanwire/fanwire/gateway/internal/flush"
)

// A connection's turn on its flusher (package internal/flush), and the writer
// goroutine it gets when its socket would block.
//
// conn.writerRunning is the writer's role: a flusher takes it for a turn
// (one mailbox batch) and gives it back, or hands it, with the
// connection's task slot, to catchUp. Giving it back follows retire's
// protocol: a wake that raced with it is put back and queues the
// connection again, so none is lost and two goroutines never write.

// flushResult is how a flusher's turn ended.
type flushResult int

const (
	flushDone    flushResult = iota // everything taken is on the socket
	flushFailed                     // a write failed; the socket is cut
	flushHandOff                    // the connection's own writer must go on
)

// Queued is the connection's place on its flushers' ready queue
// (flush.Conn).
func (c *conn) Queued() *atomic.Bool { return &c.shared.queued }

// FlushTurn is the connection's turn on its flusher (flush.Conn).
func (c *conn) FlushTurn() {
	c.shared.queued.Store(false) // from here a wake queues the connection again
	if !c.writerRunning.CompareAndSwap(false, true) {
		return // its writer goroutine runs and has the wake
	}
	c.mu.Lock()
	if c.closed { // serve has ended, or waits for its tasks
		c.mu.Unlock()
		c.writerRunning.Store(false)
		return
	}
	c.tasks.Add(1)
	c.mu.Unlock()
	switch c.flushNB() {
	case flushDone:
		c.writerRunning.Store(false)
		select {
		case <-c.cl.Wake: // woken meanwhile: queue it again
			c.cl.Signal()
		default:
		}
		c.tasks.Done()
	case flushFailed: // the role stays taken: nothing writes again
		c.tasks.Done()
	case flushHandOff:
		c.s.metrics.WriterHandoffs.Inc()
		go c.catchUp() // owns the role and the task
	}
}

// hurry is the client's onBehind hook: the mailbox is over half full, the
// connection is falling behind. Unless a flusher's turn or a writer holds
// the role, it gets a writer goroutine of its own (catchUp) until it has
// caught up, as a socket that would block does. A queue served in order
// had let a burst overflow a connection at its back that could keep up
// (about 1 run in 7 at 200 clients on a loaded machine): a goroutine of its
// own leaves it to the scheduler, as a writer per connection did.
func (c *conn) hurry() {
	if !c.writerRunning.CompareAndSwap(false, true) {
		return
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		c.writerRunning.Store(false)
		return
	}
	c.tasks.Add(1)
	c.mu.Unlock()
	c.s.metrics.WriterHandoffs.Inc()
	go c.catchUp()
}

// flushNB writes one mailbox batch without waiting for the socket. A
// close to perform, a socket the library is writing, or bytes the socket
// did not take, hand the connection to its own writer.
func (c *conn) flushNB() flushResult {
	if c.closeCode.Load() != 0 {
		return flushHandOff // the close handshake waits: not on a flusher
	}
	select { // this turn takes everything queued before the wake
	case <-c.cl.Wake:
	default:
	}
	fw := c.fw
	if !fw.TryBeginBatch() {
		return flushHandOff
	}
	b := c.cl.Mailbox.Take()
	if b.Len() == 0 {
		_, _ = fw.EndBatchNB()
		return flushDone
	}
	pending, err := c.frameBatchNB(&b)
	n := b.Len()
	b.Release()
	if err != nil {
		c.writeErr.Store(true)
		c.closeNow() // ends the reader too
		return flushFailed
	}
	if pending {
		c.shared.pendingItems = uint64(n)
		return flushHandOff
	}
	c.written.Add(uint64(n))
	return flushDone
}

// frameBatchNB frames the batch's items into the writer's batch buffer,
// '\n'-separated in frames of at most MaxFrameBytes (a single larger item
// gets a frame of its own), as writeBatch does through the library,
// writing without waiting whenever the next frame would not fit in the
// buffer. It ends the batch (EndBatchNB) and reports whether bytes are
// pending.
func (c *conn) frameBatchNB(bt *fanout.Batch) (pending bool, err error) {
	fw := c.fw
	limit := c.s.cfg.MaxFrameBytes
	var frames, bytes int
	s, i := bt.First(), 0
	for err == nil {
		// Measure the frame first: its header carries its length.
		n, count := 0, 0
		for ms, mi := s, i; ms != nil; {
			items := bt.Used(ms)
			if mi == len(items) {
				ms, mi = bt.Next(ms), 0
				continue
			}
			size := items[mi].WireLen()
			if count > 0 && n+1+size > limit {
				break
			}
			if count > 0 {
				n++
			}
			n += size
			count++
			mi++
		}
		if count == 0 {
			break
		}
		if len(fw.Out) > 0 && len(fw.Out)+maxFrameHeader+n > cap(fw.Out) {
			// Write what is there rather than grow the pooled buffer: a
			// reallocation per batch of a burst doubled its CPU.
			if err = fw.TryFlush(); err != nil {
				break
			}
		}
		fw.AppendHeader(n)
		for k := 0; k < count; {
			items := bt.Used(s)
			if i == len(items) {
				s, i = bt.Next(s), 0
				continue
			}
			if k > 0 {
				fw.Out = append(fw.Out, '\n')
			}
			fw.Out = items[i].AppendTo(fw.Out)
			i++
			k++
		}
		frames, bytes = frames+1, bytes+n
	}
	pending, eerr := fw.EndBatchNB()
	if err == nil {
		err = eerr
	}
	c.s.metrics.Frames.Add(float64(frames))
	c.s.metrics.BytesSent.Add(float64(bytes))
	c.sent.Add(uint64(bytes))
	return pending, err
}

// maxFrameHeader is the longest header of a server's frame.
const maxFrameHeader = 10

// catchUp is the writer of a connection a flusher handed over: it writes
// what the socket did not take, waiting as long as it takes, then drains the
// mailbox as writeLoop does, and gives the connection back to the flushers
// once nothing is queued. A close requested meanwhile is performed here.
func (c *conn) catchUp() {
	defer c.tasks.Done()
	if err := c.fw.FlushPending(); err != nil {
		c.writeErr.Store(true)
		c.closeNow()
		return
	}
	if n := c.shared.pendingItems; n > 0 {
		c.shared.pendingItems = 0
		c.written.Add(n)
	}
	for {
		if code := c.closeCode.Load(); code != 0 {
			c.finish(int(code))
			return
		}
		select {
		case <-c.cl.Wake:
		default:
		}
		if !c.drain() {
			return
		}
		if code := c.closeCode.Load(); code != 0 {
			c.finish(int(code))
			return
		}
		c.writerRunning.Store(false)
		select {
		case <-c.cl.Wake:
			if c.writerRunning.CompareAndSwap(false, true) {
				continue // more came: go on here
			}
			c.cl.Signal() // the flusher that took over gets it
		default:
		}
		return
	}
}

// sharedFlush is a connection's state with the shared flushers.
type sharedFlush struct {
	pool         *flush.Pool // static: the flushers that write for the connection (nil: its own writer goroutine always; TLS, GraphQL)
	queued       atomic.Bool // on pool's ready queue
	pendingItems uint64      // owned by the writer's role: items of the bytes a flusher left pending
}
