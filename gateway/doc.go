// Package gateway is the ws role: it consumes one broker subscription per
// node and fans every event out to WebSocket clients, native and GraphQL.
//
// Data flow: the broker's consume loop hands batches to Server.dispatch,
// which validates each message once and builds one immutable
// fanout.Event (the envelope's head and tail around the data). The
// fanout.Hub matches the event's subject against its subscription index
// and queues a 16-byte fanout.Item per matching connection into that
// connection's bounded fanout.Mailbox. Each connection's writer splices
// its pre-encoded subscription list into the shared bytes while it builds
// a frame, so a delivery never copies or re-encodes the event.
//
// Layers, top down; each package's arrows point down only. This package:
// the Server, its HTTP endpoints and the connections, in named groups
// of files: the native transport (conn*.go, protocol.go), GraphQL
// (graphql*.go), resumes and feeds (resume*.go, feed.go), publishing
// (publish*.go, clientpublish.go), the inspector (admin*.go). Below it:
// internal/presence (members and their watches), auth (tokens and
// grants), tlscert (the listener's certificate), internal/admission (the
// connect rate and per-IP counts), internal/netconn (the socket's frame
// writer), internal/flush (the shared flushers), internal/idlepark (the
// idle poller); and the fan-out core, internal/fanout (events, mailboxes,
// the hub: its index, dispatcher, views and recent ring) on
// internal/trie (the subject trie) and internal/filter (row filters).
// The layers above the core reach it through a fanout.Client (its
// mailbox, and the hooks OnOverflow, OnWake, OnBehind and Encode that a
// transport sets), an Event's or a subscription list's Ext (what a
// transport attaches, which the core never reads), the hub's
// DispatchMetrics and its WakeBatch (the shared flushers). A new
// transport adds files or a package above the core; it does not edit the
// core.
//
// A subscription with a where (or a row-filtered grant) is a
// fanout.View: the hub evaluates each filter once per event however many
// views share it, charging each connection's fanout.FilterBudget, and a
// view holds the subjects it has delivered, so that a document that stops
// passing gets a leave. Presence (package internal/presence, above the
// core; its commands in conn_presence.go and graphql_presence.go) keeps
// each node's members and a replica of the other nodes', kept in step
// over the broker's bus, and sends changes to watchers through the same
// mailboxes: it knows a connection as a presence.Conn (its id and its
// fanout.Client). The inspector
// (admin.go) reads connections, subscriptions and mailboxes from HTTP
// handler goroutines: the connection set under Server.mu, each
// connection's subscriptions under conn.subsMu, counters by atomics.
//
// Concurrency contract:
//   - Run owns the dispatching goroutine (the broker's Consume loop). It is
//     the only goroutine that calls Hub.Dispatch; the dispatcher never blocks
//     on a connection: a full mailbox closes that connection with 4008.
//   - Each connection has a reader: a goroutine the server starts after the
//     upgrade (the HTTP handler then returns, so net/http's per-request
//     state does not live as long as the WebSocket), owned by the server's
//     WaitGroup; it reads and owns the connection's subscriptions. A reader
//     that has handled all its client sent parks the socket with the
//     server's idle poller (internal/idlepark: one epoll set, one
//     goroutine) and exits; the poller starts a new reader when the socket is readable, so
//     an idle connection holds no goroutine. A plain-TCP native connection
//     is written by the shared flushers (internal/flush: goroutines owned by the
//     pool, running only while connections are queued; Shutdown waits for
//     them), which never wait for a socket: one that would block hands its
//     connection to a writer goroutine of its own until its mailbox is
//     drained (conn_flush.go). A TLS or GraphQL connection's writer is
//     started on demand when the mailbox is woken (ensureWriter) and exits
//     after writerLinger with nothing to write (retire). The last reader
//     waits for its writer, and for a flusher's turn on it, before the
//     connection ends. Only the holder of the writer's role
//     (conn.writerRunning) writes to the socket.
//   - A client publish (the native publish message, the GraphQL publish
//     mutation over WebSocket) runs on the connection's reader, which
//     reads on once the broker has the event or half of PingTimeout has
//     passed: no goroutine per publish, one connection's publishes in order
//     (clientpublish.go).
//   - An upgrade request past Config.MaxConnectRate waits for admission
//     on its own handler goroutine, in a bounded FIFO (internal/admission): no
//     goroutine of the admission's own; the head waiter sleeps until the
//     next token and hands the head on. Shutdown, and the HTTPServer's
//     Shutdown, refuse every waiter at once (503 shutting_down).
//   - Serve Handler with HTTPServer: its header timeout (HandshakeTimeout)
//     bounds a connection's time from accept to upgrade; after the upgrade
//     pings and the mailbox bound govern it (httpserver.go).
//   - With Config.AdminApart, serve AdminHandler with AdminHTTPServer on a
//     listener of its own (admin_listener.go: plain HTTP, whole requests
//     bounded by its timeouts) and shut it down with the node; it starts no
//     goroutine of its own: its handlers run on net/http's, as the
//     inspector's do on the client listener.
//   - For HTTPS and wss://, serve on tls.NewListener with tlscert.Files'
//     TLSConfig (package tlscert): it starts no goroutine; the handshake's own
//     goroutine looks at the files (at most every check interval) and loads
//     a changed pair under the Files' mutex, again at every check while
//     it does not load (package reload). The TLS handshake runs within
//     HandshakeTimeout.
//   - auth.JWTAuth's key files are looked at the same way, by the goroutine
//     verifying a token, under its key store's mutex (package auth): no
//     goroutine of its own.
//   - Shutdown refuses new connections, asks every writer to drain and close
//     with 1001, and waits for every connection's goroutines. Cancel Run's
//     context after Shutdown returns.
//   - The subscription index is guarded by one RWMutex: the dispatcher holds
//     it for reading for one batch (≤ 256 events); subscribe and unsubscribe
//     take it briefly for writing.
package gateway
