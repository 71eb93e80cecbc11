// Package loadtest measures a running fanwire gateway end to end: it connects
// many WebSocket clients to the gateway's native endpoint, subscribes them all
// to one subject, publishes numbered, timestamped events straight into NATS and
// checks that every client receives every event exactly once and in order,
// also clients that drop their connection and resume from a cursor, also
// through a reconnect storm (storm.go), when a node drains and every client
// comes back on another one, or,
// with Config.Where, that each client, a filtered view of its own rows,
// receives exactly its rows' events, in order (views_config.go), and,
// in a churn soak, whether the gateway's goroutines and heap come back to
// their baseline after thousands of clients have come and gone. It
// reports delivery throughput, latency percentiles and, when given the
// gateway's pid, the gateway's CPU time and peak RSS over the run.
//
// The client side is built to be cheap, because on a small machine it shares
// the CPUs with the gateway it measures: events are recognised with
// bytes.Index and hand-written integer parsing (no encoding/json per event),
// each connection reuses one read buffer, and the per-event path (parse,
// verify, record latency) allocates nothing. GraphQL clients, which get one
// event per WebSocket message, speak WebSocket through a minimal client of
// this package's own (wsConn) rather than coder/websocket, whose
// per-message cost would otherwise be most of theirs.
//
// # Concurrency contract
//
// Run owns every goroutine it starts and returns only after all of them have
// exited:
//   - up to 50 dial workers while clients connect (dialConcurrency);
//   - one reader goroutine per client, the only goroutine that reads its
//     connection and the only writer of that client's tallies; a resuming
//     client's reader (Config.ResumeShare) also drops its connection at the
//     planned points and dials and subscribes the next one itself;
//   - one close watcher per client connection (a context.AfterFunc), which
//     closes it with a normal closure when the run stops (or at once,
//     without a handshake, when the caller's context is cancelled); the reader
//     stops it, or waits for it, before dropping that connection or exiting.
//     A GraphQL watcher that finds its reader between two reads reads the
//     connection itself, skipping data, until the gateway's close arrives;
//     the reader's next read waits for it;
//   - one publisher goroutine;
//   - in a churn run (Config.Churn), one soak goroutine, which reads the
//     gateway's /metrics on its schedule and owns Config.ChurnClients
//     churner goroutines: each runs its sessions one after another, is
//     the only goroutine that reads its current connection, and has a
//     close watcher per connection like a client's. The soak waits for
//     every churner before it reads the gateway's after figures, and Run
//     waits for the soak;
//   - in a reconnect storm (Config.StormURL), one storm goroutine, which
//     waits for Config.StormAfter events, calls Config.StormStop on a
//     goroutine of its own and waits for it, and reads node B's /proc
//     until every client is back and caught up or the run is over; each
//     client's reader, when its connection ends, waits out its backoff
//     and dials node B itself (stop ends the wait and the dial). Run
//     waits for the storm goroutine.
//
// The monitor loop runs on the caller's goroutine: it reads per-client atomic
// counters (stored once per frame), writes Config.Progress and decides when the
// run is over. Config.Progress is written only from the goroutine that called
// Run, so it needs no locking. Run may be called concurrently; each call uses
// its own subject by default so runs do not see each other's events.
//
// ProcSampler reads /proc and works only on Linux.
package loadtest
