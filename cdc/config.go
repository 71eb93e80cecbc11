package cdc

import (
	"errors"
	"fmt"
	"path/filepath"
	"regexp"
	"time"

	"github.com/fanwire/fanwire/broker"
	"go.uber.org/zap"
)

// Config configures the ingest role. Zero values take the defaults below.
type Config struct {
	DSN         string        // PostgreSQL connection string (required); the replication connection is made from it
	Broker      broker.Broker // where events go (required)
	Slot        string        // logical replication slot (default "fanwire"), created if missing
	Publication string        // publication (default "fanwire"), created if missing
	Prefix      string        // first subject token (default "db")
	Tables      []string      // tables to publish ("table" in public, or "schema.table"); empty: every table of the publication
	Rebootstrap bool          // drop the slot and bootstrap again

	// FlushWindow is how long the documents of projections coalesce across
	// transactions (a document changed by several of them is published
	// once; default 2ms; negative: none). Table events never wait on a
	// timer: the publisher sends at once when no publish is in flight, and
	// what arrives while one is becomes the next batch.
	FlushWindow    time.Duration
	MaxBatch       int           // most events per publish (default 4096)
	BootstrapChunk int           // rows per bootstrap fetch (default 10,000)
	StatusInterval time.Duration // standby status update period (default 1s)
	Heartbeat      time.Duration // on an idle database, emit a logical message this often so the slot advances (default 10s; negative: never)
	Retry          time.Duration // wait before reconnecting after a lost connection (default 1s)
	// PublishTimeout: a publish the broker has not acknowledged by then
	// ends the run, and the next one learns from the broker what it stores
	// (default 30s; the broker rides out shorter failovers itself).
	PublishTimeout time.Duration
	// SlotWait is how long a new leader waits for the slot to be released
	// by the walsender of the ingest it took over from (default 30s).
	SlotWait time.Duration
	// LeaderTimeout: a leader whose lock session stays idle this long
	// (the process frozen) loses the lock to a standby (PostgreSQL 14+;
	// default 10s; negative: never). The leader pings it every quarter of
	// this.
	LeaderTimeout time.Duration

	// Projections are the documents to publish (--config); see
	// docs/projections.md.
	Projections []ProjectionSpec
	// StateDir holds the memory-mode projections' state, one file per slot
	// (default ".fanwire/ingest"), and the spill files of transactions
	// larger than MaxTxnMemory.
	StateDir string

	// MaxTxnMemory bounds the memory the changes of open transactions take
	// (the one being received and the streamed ones not committed yet), in
	// bytes, estimated from their decoded tuples (default 32 MiB), with
	// what committed ones still hold for their documents (the keys waiting
	// for the flush window, the memory state's changes waiting for the
	// broker's ack). Past it,
	// the largest of them moves to a temp file under StateDir, where the
	// rest of its changes go too; its commit reads them back in order.
	// pgoutput sends a transaction's changes before its commit, so without
	// this a multi-GB transaction would run the ingest out of memory. 32 MiB
	// leaves room, under an RSS of 128 MiB, for the queue below, the
	// events being built and the runtime (docs/benchmarks.md).
	MaxTxnMemory int64
	// QueueEvents and QueueBytes bound the events the reader has handed the
	// publisher and the broker has not acknowledged yet (queued, batched or
	// in flight), by count and by size (Data, Subject and ID, plus the
	// event's own 56 bytes; defaults 32,768 and 16 MiB). The reader waits at
	// the bound (back-pressure: PostgreSQL keeps the WAL), nothing is
	// dropped. One hand-over bigger than a bound (a bootstrap chunk of
	// large rows) still goes when nothing else is queued. 32,768 is eight
	// MaxBatch slices: the reader can build the next slices while one is in
	// flight; 16 MiB caps big rows (~500 B or more) at the same memory.
	QueueEvents int
	QueueBytes  int64

	Logger *zap.Logger
}

var identRE = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

// prefixRE is what --prefix may be: one subject token of the bytes a table
// or key token keeps as they are (subjectToken), so that no table's subject
// can be taken for another prefix's.
var prefixRE = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

func (c *Config) setDefaults() {
	if c.Slot == "" {
		c.Slot = "fanwire"
	}
	if c.Publication == "" {
		c.Publication = "fanwire"
	}
	if c.Prefix == "" {
		c.Prefix = "db"
	}
	if c.FlushWindow == 0 {
		c.FlushWindow = 2 * time.Millisecond
	}
	if c.MaxBatch == 0 {
		c.MaxBatch = 4096
	}
	if c.BootstrapChunk == 0 {
		c.BootstrapChunk = 10_000
	}
	if c.StatusInterval == 0 {
		c.StatusInterval = time.Second
	}
	if c.Heartbeat == 0 {
		c.Heartbeat = 10 * time.Second
	}
	if c.Retry == 0 {
		c.Retry = time.Second
	}
	if c.PublishTimeout == 0 {
		c.PublishTimeout = 30 * time.Second
	}
	if c.SlotWait == 0 {
		c.SlotWait = 30 * time.Second
	}
	if c.LeaderTimeout == 0 {
		c.LeaderTimeout = 10 * time.Second
	}
	if c.Logger == nil {
		c.Logger = zap.NewNop()
	}
	if c.StateDir == "" {
		c.StateDir = filepath.Join(".fanwire", "ingest")
	}
	if c.MaxTxnMemory == 0 {
		c.MaxTxnMemory = 32 << 20
	}
	if c.QueueEvents == 0 {
		c.QueueEvents = 32 << 10
	}
	if c.QueueBytes == 0 {
		c.QueueBytes = 16 << 20
	}
}

func (c *Config) validate() error {
	var errs []error
	if c.DSN == "" {
		errs = append(errs, errors.New("DSN is required (--pg postgres://user@host:5432/db)"))
	}
	if c.Broker == nil {
		errs = append(errs, errors.New("Broker is required"))
	}
	// Slot and publication names go into replication commands unquoted.
	if !identRE.MatchString(c.Slot) {
		errs = append(errs, fmt.Errorf("slot %q: use lower-case letters, digits and '_' (PostgreSQL's rule for slot names)", c.Slot))
	}
	if !prefixRE.MatchString(c.Prefix) {
		errs = append(errs, fmt.Errorf("prefix %q: one subject token of letters, digits, '_' and '-' (--prefix; events go to <prefix>.<table>.<key>)", c.Prefix))
	}
	if !identRE.MatchString(c.Publication) {
		errs = append(errs, fmt.Errorf("publication %q: use lower-case letters, digits and '_'", c.Publication))
	}
	if c.MaxBatch < 0 || c.BootstrapChunk < 0 {
		errs = append(errs, errors.New("MaxBatch and BootstrapChunk must not be negative"))
	}
	if c.MaxTxnMemory < 0 {
		errs = append(errs, fmt.Errorf("MaxTxnMemory %d: must not be negative (--max-txn-memory, bytes)", c.MaxTxnMemory))
	}
	if c.QueueEvents < 0 || c.QueueBytes < 0 {
		errs = append(errs, errors.New("QueueEvents and QueueBytes must not be negative"))
	}
	if c.LeaderTimeout > 0 && c.LeaderTimeout < time.Second {
		errs = append(errs, fmt.Errorf("leader timeout %v: at least 1s (the leader pings its lock every quarter of it), or negative for none", c.LeaderTimeout))
	}
	return errors.Join(errs...)
}
