// Package netconn is the socket under a server-side WebSocket: the
// hijack that hands coder/websocket a 16-byte bufio.Writer over a
// FrameWriter, which reassembles each frame's pieces and sends the whole
// frame with one writev (net/http's 4 KiB writer cost a 27 KB frame of
// coalesced events seven write syscalls, and socket writes were half of
// the gateway's CPU in a profile of a 200-client burst on 2 cores), and
// batches of text messages framed by the connection's writer itself,
// written blocking or, on plain TCP, never waiting (the flushers').
//
// Concurrency: a FrameWriter is safe for concurrent use: the library
// writes its frames (pings, pongs, closes) under its own frame lock, and
// a batch (BeginBatch to EndBatch, or TryBeginBatch to EndBatchNB) holds
// the writer's mutex, so the library's frames wait for it; only one
// goroutine at a time runs a batch (the connection's writer role).
// PrefixConn's Reached is an atomic, read by the idle poller.
package netconn
