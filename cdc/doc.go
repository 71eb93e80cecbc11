// Package cdc is the ingest role: it turns committed PostgreSQL changes,
// read through logical replication (pgoutput), into events in the broker,
// exactly once on brokers that keep history (JetStream, Redis Streams).
//
// The pipeline, one goroutine each:
//
//		replication connection ─► decode ─► transactions ─► projection ─► batches ─► broker
//		        ▲                                                                     │
//		        └──────────── confirmed LSN (after the broker's ack) ◄─────────────────┘
//
//	  - The reader owns the replication connection: it answers keepalives,
//	    decodes pgoutput messages, assembles transactions (buffering streamed
//	    ones per xid until their stream commit, dropping aborted ones and
//	    aborted subtransactions) and hands each committed transaction's
//	    changes to the projection stage. A held change is its pgoutput
//	    message as received (checked, copied into its transaction's arena),
//	    decoded into reused memory only at its commit, straight into its
//	    event: a change's decoded values live only while it is applied.
//	    Open transactions hold at most Config.MaxTxnMemory together; past
//	    it the largest spills to a file under Config.StateDir, read back at
//	    its commit (hold.go, spill.go). While a big transaction arrives,
//	    its reads are paced so that each takes many messages
//	    (ingest_pace.go). The reader removes its spill files when it ends.
//	  - Between the reader and the publisher at most Config.QueueEvents
//	    events and Config.QueueBytes bytes wait (budget.go), counting those
//	    being published: the reader blocks at the bound, nothing is dropped.
//	  - A projection turns a change into the documents it affects. A table is
//	    the trivial projection: the row is the document and its primary key
//	    the key. (Projections with embedded child rows plug in here.)
//	  - The publisher collects events for at most the flush window (or a max
//	    batch), asks the slot lock's lease (lease.go: a leader woken after a
//	    takeover publishes nothing), publishes them through the broker, which
//	    stores a prefix of them in order and returns once every one is
//	    acknowledged, and only then advances the LSN that the reader confirms
//	    to PostgreSQL. A crash re-reads what was not confirmed; the next run
//	    asks the broker for its high-water mark (its own: every id starts
//	    with the ingest's writer name, writers.go) and skips what is at or
//	    before it (highwater.go), by ids that order the events as they were
//	    published (eventid.go). A failed publish ends the run. A stop
//	    (SIGTERM) hands over what was decoded, waits for the acks and
//	    confirms them first.
//	  - Each change keeps the table definition of the Relation message
//	    before it (relation.go): DDL in the middle of a transaction leaves
//	    the changes before it as they were written. Tables published after
//	    the slot's bootstrap are bootstrapped late, from a snapshot of
//	    their own, beside the reader (lateboot.go: one goroutine per table,
//	    owned by the run, stopped and waited for before the publisher).
//	  - The ingest's registration in the broker (writers.go) is renewed by
//	    a goroutine the run owns.
//	  - A row that cannot be published becomes an error event in its place
//	    (badrow.go): one bad value never stops the ingest.
//
// A new slot starts with a consistent bootstrap: the snapshot the slot
// exported is scanned table by table, and the tail then starts at the
// slot's consistent point, so nothing is missed or doubled.
package cdc
