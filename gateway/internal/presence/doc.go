// Package presence is who is here, on a subject, across every node.
//
// A connection tracks itself on a concrete subject with a small state
// (Track); it is then a member of that subject until it untracks or its
// connection ends, for any reason (LeaveAll). A member is its
// connection's id (its key), its token's sub and its state: the server
// sets the first two, the client only the state.
//
// Every node keeps a replica of every subject's members: its own
// connections' (the authority for them), and every other node's, learnt
// over the broker's bus (bus.go). A watch (a subscription with
// "presence") gets the changes of the subjects its pattern matches, as
// "presence" events in its connection's mailbox, in order with its
// subscription's events; Page lists a subject's members with their
// count.
//
// Big rooms: a subject with more than Config.ListLimit members has its
// changes coalesced per Config.Interval into one message per watch (a
// member that joins and leaves within it appears in neither), so a join
// costs each watcher a few bytes at the next tick, never a list. Messages
// are cut to fit the watchers' mailboxes, and a tick sends at most half a
// mailbox of a subject's changes (watch.go).
//
// It knows nothing of the transports: a watcher is a Conn (an id and a
// fanout.Client), and what a transport attaches to a change's event is
// Config.Parts.
//
// Concurrency: every method is safe for concurrent use; the replica, the
// watches and the bus's state are guarded by one mutex, and deliveries
// are pushed to mailboxes under it (writers are woken, and overflowed
// connections told, after it is released). Run owns the bus's goroutines
// (a listener, and a loop that sends, beats and sweeps) until its context
// ends; Drain says bye before the node stops.
package presence
