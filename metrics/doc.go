// Package metrics holds the ingest role's WAL message counters: every
// pgoutput message counted by its type byte (Kind: begin, insert,
// stream_start, commit_prepared, …) and by what the ingest did with it
// (Route: publish, state, skip), exported to Prometheus as
// fanwire_wal_messages_total{kind,route}.
//
// # Hot path
//
// The counters are an inline fixed array, [20 kinds][3 routes]uint64: the
// 19 kinds of PostgreSQL's LogicalRepMsgType (protocol versions 1–3) and one
// row for every other byte, labelled "unknown" (an unknown byte is a protocol
// the decoder does not speak; the decoder's error names the byte, and one row
// keeps the label set bounded and the array at 480 bytes). A [256]uint8
// table maps the byte to its row. Observe is one table load and one add: no
// map, no lock, no atomic, no allocation. BenchmarkObserve measures it
// against the map[key]uint64 it replaces.
//
// # Concurrency contract
//
// One goroutine owns a WAL: the ingest loop. Only it calls Observe and
// Publish. Observe writes plain uint64s that no other goroutine reads.
//
// Publish copies the changed cells into a second, published array of
// atomic.Uint64 under a sequence counter (a seqlock: odd while copying).
// Any goroutine may call Snapshot or scrape the Collector: they read the
// published array and retry if a Publish overlapped; they never block the
// owner and never write. So:
//   - The owner must call Publish at the boundaries a scrape should see:
//     after each commit, and before blocking for the next message. A
//     scrape is at most that far behind. Publish compares the 60 cells with
//     plain loads and returns when nothing changed; otherwise it pays one
//     atomic store per changed cell plus two. With one-row transactions,
//     publish per batch of commits rather than per commit (see Publish).
//   - A snapshot is one Publish's cut: begin and commit counts agree when
//     the owner publishes after commits, and every counter is monotonic.
//   - Scraping never resets or changes a counter.
//
// Why not the alternatives: an atomic add per Observe (LOCK XADD) costs
// several nanoseconds, more than the whole 1 ns budget; a snapshot requested
// over a channel would make a scrape wait for the ingest loop, which may be
// blocked on the network; plain reads of the owner's array are a data race
// (and fail go test -race).
package metrics
