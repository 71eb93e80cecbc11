package flush

import (
	"sync"
	"sync/atomic"
)

// Conn is a connection the flushers write.
type Conn interface {
	// Queued is the connection's place on the ready queue: Enqueue sets
	// it, the connection clears it when its turn starts (from then on a
	// wake queues it again).
	Queued() *atomic.Bool
	// FlushTurn writes what the connection has, never waiting for its
	// socket.
	FlushTurn()
}

// Pool is the ready queue and its flushers.
type Pool struct {
	max int // static: most flushers at once

	mu      sync.Mutex
	ready   []Conn // guarded by mu: connections to flush, each once (Conn.Queued), from head
	head    int    // guarded by mu
	running int    // guarded by mu: flusher goroutines
	held    bool   // guarded by mu: the dispatcher is queuing a batch; it starts flushers at release
	stopped bool   // guarded by mu: no flusher starts
	wg      sync.WaitGroup
}

// New runs at most n flushers at once (GOMAXPROCS: more only take turns
// on the same processors; 4 on 2 cores measured no better than 2).
func New(n int) *Pool {
	return &Pool{max: max(n, 1)}
}

// Hold makes the pool wait for release before it starts a flusher: the
// dispatcher queues a batch's connections, then starts the flushers once.
func (p *Pool) Hold() {
	p.mu.Lock()
	p.held = true
	p.mu.Unlock()
}

// Release ends Hold and starts flushers for what was queued.
func (p *Pool) Release() {
	p.mu.Lock()
	p.held = false
	p.startLocked()
	p.mu.Unlock()
}

// Stop waits for every flusher and starts no more. Call it once no
// connection is left to queue.
func (p *Pool) Stop() {
	p.mu.Lock()
	p.stopped = true
	p.mu.Unlock()
	p.wg.Wait()
}

// Enqueue queues c for a flush, once until its turn comes.
func (p *Pool) Enqueue(c Conn) {
	if !c.Queued().CompareAndSwap(false, true) {
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
func (p *Pool) startLocked() {
	for !p.stopped && p.running < p.max && p.running < len(p.ready)-p.head {
		p.running++
		p.wg.Add(1)
		go p.run()
	}
}

// next takes the next connection from the queue, or ends the flusher
// (false) when it is empty.
func (p *Pool) next() (Conn, bool) {
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
func (p *Pool) run() {
	defer p.wg.Done()
	for {
		c, ok := p.next()
		if !ok {
			return
		}
		c.FlushTurn()
	}
}
