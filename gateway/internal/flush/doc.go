// Package flush is the shared flushers: the writers of plain-TCP native
// connections whose sockets take what they are given.
//
// At a sustained rate every dispatched batch brings each connection a few
// events, and waking one writer goroutine per connection per batch cost a
// goroutine wake-up, a select, a timer reset and a trip through the
// websocket library per frame (docs/benchmarks.md, "Load test: sustained
// rate and latency"). Instead, the dispatcher queues the connections it
// woke on one ready queue and starts up to a few flushers once per batch.
// Each flusher takes one connection at a time from the queue and writes its
// frames without ever waiting (the connection's non-blocking batches): a
// socket that would block hands the rest to a writer goroutine of the
// connection's own, so one slow client never holds up the others, and one
// goroutine still writes a socket at a time (the connection's writer
// role, whoever holds it). The queue is
// shared, not sharded: a flusher whose thread the OS preempts in the
// middle of a pass delays one connection, not a shard of them, because the
// others take the rest of the queue.
//
// A flusher runs while the queue holds connections and exits when it is
// empty: an idle gateway holds no flusher goroutine.
//
// Concurrency: a Pool is safe for concurrent use; its queue is guarded by
// its mutex. Its WaitGroup owns the flushers; Stop waits for them (the
// gateway stops the pool once every connection has ended). The
// dispatcher brackets a batch's wake-ups with Hold and Release (the
// pool is the hub's fanout.WakeBatch).
package flush
