// Package fanout is the gateway's fan-out core: an Event (one broker
// message encoded once, shared read-only by every delivery), an Item (one
// delivery: the event and a connection's subscription list, spliced
// together only when written), a Client (a connection's bounded Mailbox
// of items and the hooks that wake its writer), and the Hub: the
// subscription index, the view index of filtered subscriptions (Views,
// with the documents they hold and their connections' FilterBudgets), the
// dispatcher that matches each event once and pushes it to every match,
// and the Recent ring from which a resume is handed over to the live
// feed. It knows nothing of transports, GraphQL, presence or HTTP: what a
// transport attaches to an event or a list (Ext) it never reads, and what
// it does on a wake-up, an overflow or a filled mailbox are the Client's
// hooks and the Hub's WakeBatch.
//
// Concurrency: one goroutine at a time calls Hub.Dispatch (the broker's
// consume loop); it holds the index's read lock for the batch and never
// blocks on a client. Subscribe, Unsubscribe, RemoveView and Locked take
// the write lock briefly, from any goroutine; what runs under Locked (a
// resume's hand-over, a reply queued with a subscription) sees nothing
// being dispatched. A View is its subscription's goroutine's until it is
// filed, then the dispatcher's. An Event is immutable once shared, but
// for the parse its filters share (Parsed, an atomic pointer; Dispatch
// drops it after its batch). A Mailbox is safe for concurrent use: any
// goroutine pushes (its own mutex), one writer takes, and a Batch is that
// writer's alone until Release. The Recent ring is the Hub's: Dispatch
// adds under the read lock, Tx.RecentAfter reads under the write lock.
package fanout
