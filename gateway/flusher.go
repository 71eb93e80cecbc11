package gateway

import "sync"

// Shared flushers: the writers of plain-TCP native connections whose
// sockets take what they are given.
//
// At a sustained rate every dispatched batch brings each connection a few
// events, and waking one writer goroutine per connection per batch cost a
// goroutine wake-up, a select, a timer reset and a trip through the
// websocket library per frame (docs/benchmarks.md, "Load test: sustained
// rate and latency"). Instead, the dispatcher queues the connections it
// woke on one ready queue and starts up to a few flushers once per batch.
// Each flusher takes one connection at a time from the queue and writes its
// frames without ever waiting (netconn.FrameWriter.TryBeginBatch, TryFlush): a
// socket that would block hands the rest to a writer goroutine of the
// connection's own (conn.catchUp), so one slow client never holds up the
// others, and one goroutine still writes a socket at a time
// (conn.writerRunning is the writer's role, whoever holds it). The queue is
// shared, not sharded: a flusher whose thread the OS preempts in the
// middle of a pass delays one connection, not a shard of them, because the
// others take the rest of the queue.
//
// A flusher runs while the queue holds connections and exits when it is
// empty: an idle gateway holds no flusher goroutine. The pool's WaitGroup
// owns them; Server.Shutdown stops the pool once every connection has
// ended.

// flushPool is the ready queue and its flushers.
type flushPool struct {
	max int // static: most flushers at once

	mu      sync.Mutex
	ready   []*conn // guarded by mu: connections to flush, each once (sharedFlush.queued), from head
	head    int     // guarded by mu
	running int     // guarded by mu: flusher goroutines
	held    bool    // guarded by mu: the dispatcher is queuing a batch; it starts flushers at release
	stopped bool    // guarded by mu: no flusher starts
	wg      sync.WaitGroup
}

// newFlushPool runs at most n flushers at once (GOMAXPROCS: more only take
// turns on the same processors; 4 on 2 cores measured no better than 2).
func newFlushPool(n int) *flushPool {
	return &flushPool{max: max(n, 1)}
}

// hold makes the pool wait for release before it starts a flusher: the
// dispatcher queues a batch's connections, then starts the flushers once.
func (p *flushPool) Hold() {
	p.mu.Lock()
	p.held = true
	p.mu.Unlock()
}

// release ends hold and starts flushers for what was queued.
func (p *flushPool) Release() {
	p.mu.Lock()
	p.held = false
	p.startLocked()
	p.mu.Unlock()
}

// stop waits for every flusher and starts no more. Call it once no
// connection is left to queue.
func (p *flushPool) stop() {
	p.mu.Lock()
	p.stopped = true
	p.mu.Unlock()
	p.wg.Wait()
}

// enqueue queues c for a flush, once until its turn comes.
func (p *flushPool) enqueue(c *conn) {
	if !c.shared.queued.CompareAndSwap(false, true) {
		return
	}
	p.mu.Lock()
	p.ready = append(p.ready, c)
	if !p.held {
		p.startLocked()
	}
	p.mu.Unlock()
}

// startLocked starts flushers, up to one per queued connection and max in
// all; p.mu is held.
func (p *flushPool) startLocked() {
	for !p.stopped && p.running < p.max && p.running < len(p.ready)-p.head {
		p.running++
		p.wg.Add(1)
		go p.run()
	}
}

// next takes the next connection from the queue, or ends the flusher
// (false) when it is empty.
func (p *flushPool) next() (*conn, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.head == len(p.ready) {
		p.ready, p.head = p.ready[:0], 0
		p.running--
		return nil, false
	}
	c := p.ready[p.head]
	p.ready[p.head] = nil
	p.head++
	if p.head > 64 && 2*p.head > len(p.ready) { // keep the queue from creeping along its array
		n := copy(p.ready, p.ready[p.head:])
		clear(p.ready[n:])
		p.ready, p.head = p.ready[:n], 0
	}
	return c, true
}

// run gives queued connections their turns until the queue is empty. A
// connection queued again (woken during its turn) goes to the back.
func (p *flushPool) run() {
	defer p.wg.Done()
	for {
		c, ok := p.next()
		if !ok {
			return
		}
		c.flushTurn()
	}
}
