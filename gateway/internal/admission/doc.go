// Package admission decides whether an upgrade request becomes a
// connection, before any connection state exists.
//
// The node-wide connect rate (Config.MaxConnectRate): a request takes a
// token from a bucket refilled at that rate (ConnectBurst deep); when none
// is free it joins a FIFO of at most ConnectQueue waiters and is admitted
// when its turn and a token come. A request that would wait longer than
// ConnectQueueWait, or finds the queue full, is refused at once
// (ErrConnectRate: 503 connect_rate): a storm slows admissions down
// instead of taking the node's CPU, and what it holds while it waits is
// bounded by the queue.
//
// A client's address (ClientAddr): the socket's peer, or, when that peer
// is one of the TrustedProxies, the address X-Forwarded-For names. It is
// what logs call "remote"; IPCounts bounds the connections per address
// group (IPGroup: an IPv4 address, or an IPv6 address's prefix).
//
// Concurrency: all of it is safe for concurrent use, with no goroutine of
// its own. Each waiter is its request's handler goroutine: the waiter at
// the head of the queue sleeps until the next token is due, takes it and
// hands the head to the next; a waiter that leaves (its client gave up,
// its wait passed, the server drains: Close) hands the head on too. The
// queue and the bucket are guarded by the Admission's mutex, IPCounts by
// its own.
package admission
