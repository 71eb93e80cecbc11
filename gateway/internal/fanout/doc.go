// Package fanout is the bottom of the gateway's fan-out core: an Event
// (one broker message encoded once, shared read-only by every delivery),
// an Item (one delivery: the event and a connection's subscription list,
// spliced together only when written), a connection's bounded Mailbox of
// items, and the Recent ring of the last events dispatched, from which a
// resume is handed over to the live feed. It knows nothing of
// connections, transports or presence: what a transport attaches to an
// event or a list (Ext) it never reads.
//
// Concurrency: an Event is immutable once shared, but for the parse its
// filters share (Parsed, an atomic pointer; the dispatcher drops it with
// DropParsed after its batch). A Mailbox is safe for concurrent use: any
// goroutine pushes (its own mutex), one writer takes, and a Batch is that
// writer's alone until Release. A Recent ring is not: the dispatcher adds
// under the subscription index's read lock, a resume reads under its
// write lock, and those exclude each other.
package fanout
