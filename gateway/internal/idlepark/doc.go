// Package idlepark is the node's idle poller: a connection whose client
// has nothing more to say has no reader goroutine at all. Every connection's reader used to wait in a blocked
// read, and a goroutine's stack (8 to 16 KiB once a subscribe has been
// handled) was the largest part of an idle connection's memory. Now a
// reader that has consumed all its client sent (nothing buffered) hands
// the socket to the node's idle poller and exits: one epoll set, watched
// by one goroutine, for every parked socket. When the socket becomes
// readable (a message, a pong, a close frame, an EOF) the poller starts a
// new reader, whose stack starts small again.
//
// Writes do not need the reader: the gateway starts its writers on
// demand. Pings do: the pong is read by whichever reader the poller starts
// for it. A connection the server closes (finish, a write error, a ping
// timeout, a forced shutdown) is taken back by the closer (Unpark), so its
// reader sees the closed socket and cleans up, as a running reader would
// have.
//
// Only plain TCP sockets park. A TLS connection's reader may hold
// decrypted bytes the socket no longer shows as readable, so it keeps its
// goroutine.
//
// Concurrency: a Poller is safe for concurrent use; its set and each
// parked connection's Place are guarded by its mutex. It owns one
// goroutine, started by the first Park and ended after pollerLinger
// with nothing parked, or by Stop, which waits for it. The readers it
// starts (Conn.Woken, Conn.ReadOn) are the connection's.
package idlepark
