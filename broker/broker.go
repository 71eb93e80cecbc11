package broker

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
)

// Message is one event as a broker delivers it.
type Message struct {
	Subject string
	Data    []byte // owned by the receiver once delivered
	Cursor  string // position in the broker's history; "" where it keeps none (Core NATS)
}

// Outgoing is one event to publish.
type Outgoing struct {
	Subject string
	Data    []byte
	ID      string // idempotency id; brokers that deduplicate use it, others ignore it
}

// Handler receives batches of messages in broker order, on one goroutine.
// arrived is when the batch's first message reached this process.
type Handler func(batch []Message, arrived time.Time)

// Broker is what the ws role (and the ingest role) need from a broker.
type Broker interface {
	// Publish publishes msgs in order and returns each one's cursor ("" on
	// brokers without history). It returns when the broker has them (Core
	// NATS: after a flush round-trip; durable brokers: after the ack).
	Publish(ctx context.Context, msgs []Outgoing) ([]string, error)
	// Consume delivers every message on the node's subject space from now
	// on to h, until ctx is done or the broker is closed. It calls started
	// (if not nil) once its subscription is in place: every message
	// published after that is delivered. Durable brokers pass the cursor the
	// feed starts after (every later message is delivered, none before);
	// others pass "". It returns the reason it stopped.
	Consume(ctx context.Context, h Handler, started func(start string)) error
	// Ready reports whether the broker connection is up.
	Ready() bool
	// Name is the broker's kind as the --broker flag names it: "nats",
	// "jetstream" or "redis" (for logs and the GraphQL health query).
	Name() string
	// Close releases the connection; it waits for the broker's goroutines.
	Close() error
}

// Appender is implemented by brokers that can store a publisher's events
// faster when it needs no cursors (JetStream with fast batches): the
// ingest, which orders its events by their ids, not by cursors.
type Appender interface {
	// Append stores msgs in order and returns when all are stored. A
	// message whose id (Outgoing.ID) the broker already stores is dropped
	// as a duplicate. On failure the broker holds a prefix of msgs (never
	// a message after one that was refused or lost), as Publish does, and
	// the error says why the rest is not stored. opts names their writer
	// and, where the broker can check it, what it must have stored last
	// (see AppendOptions).
	Append(ctx context.Context, msgs []Outgoing, opts AppendOptions) error
}

// AppendOptions are an Append's writer and its condition.
type AppendOptions struct {
	// Writer names the publisher of every message of the call ("" none):
	// each message's ID starts with it and ':' (WriterID). Brokers that
	// keep a high-water mark per writer (Redis Streams) record the last
	// one with the messages, in the same step.
	Writer string
	// Check makes the call conditional on Last (Redis Streams; JetStream
	// ignores it, see HighWater): the writer's last stored id must be
	// Last ("": the writer has stored nothing), or nothing of the call is
	// stored and Append returns an error wrapping ErrConflict. The broker
	// checks each part of a call it sends in pieces against the part
	// before it, so a refused piece also refuses every piece after it,
	// where it would otherwise leave a gap.
	Check bool
	Last  string
	// Fence, when not nil, is asked before the broker sends again what it
	// sent and did not see acknowledged (a retry after a lost answer or a
	// failover): an error ends the call. A writer that holds a lease
	// checks it there, so a leader frozen in a retry sends nothing after
	// its lease ran out.
	Fence func(context.Context) error
}

// WriterID is the id of a writer's message: its name, ':' and the id it
// gives the message.
func WriterID(writer, id string) string { return writer + ":" + id }

// ScopedIDMark starts the ids of publishers that are not writers: the
// gateway scopes each of its publishers' ids under it
// ("~<namespace>~<id>"). A writer's name never starts with it nor holds
// ':' (CheckWriter; Append refuses another), so no other publisher's id
// is ever a writer's (WriterID): it can neither suppress a writer's event
// as a duplicate nor be taken by LastID for a writer's mark.
const ScopedIDMark = "~"

// ErrBadWriter is wrapped by the error of an Append whose writer's name
// CheckWriter refuses.
var ErrBadWriter = errors.New("bad writer name")

// CheckWriter checks a writer's name (AppendOptions.Writer; "" is none).
func CheckWriter(name string) error {
	if strings.HasPrefix(name, ScopedIDMark) || strings.Contains(name, ":") {
		return fmt.Errorf("%w: %q: a writer's name must not start with %q (other publishers' ids do) nor hold ':'", ErrBadWriter, name, ScopedIDMark)
	}
	return nil
}

// ErrConflict is wrapped by the error of a conditional Append whose
// writer's last stored id is not the one expected: another process writes
// as the same writer (a leader that lost its lease), or an earlier part of
// the writer's events was refused or lost.
var ErrConflict = errors.New("conflict")

// ErrClosed is returned by operations on a closed broker.
var ErrClosed = errors.New("broker: closed")

// ErrBadCursor is wrapped by errors about malformed cursors or cursors of
// another broker.
var ErrBadCursor = errors.New("bad cursor")

// ErrCursorExpired is wrapped by errors about cursors older than what the
// broker still retains: the client must re-sync.
var ErrCursorExpired = errors.New("cursor expired")

// Durable is implemented by brokers that keep history (JetStream, Redis
// Streams): events carry cursors and can be replayed.
type Durable interface {
	Broker
	// Replay calls h, in order, with the stored messages on filters
	// (patterns within the broker's subject space; brokers that cannot
	// filter by subject may deliver others, and callers match every message
	// themselves) whose cursor is after
	// `after` ("" = from the first retained) and not after `until`. It
	// returns an error wrapping ErrCursorExpired when `after` is older than
	// the retained history, and ErrBadCursor when a cursor is malformed,
	// from another broker, or ahead of the stream.
	Replay(ctx context.Context, filters []string, after, until string, h func([]Message) error) error
	// CompareCursors orders two valid cursors like cmp.Compare.
	CompareCursors(a, b string) (int, error)
}

// Snapshots is implemented by brokers that can read the newest stored
// message of each subject (JetStream: last-per-subject delivery; Redis
// Streams: an index of each subject's newest entry kept by the script that
// appends). A live view starts with Latest, then replays (through,
// watermark] with Replay and joins the live feed: together they give every
// subject's newest message exactly once, without reading the history.
type Snapshots interface {
	// Latest reads the newest stored message of every subject matching
	// filters (patterns within the broker's subject space; none: every
	// subject; a broker that cannot filter may deliver others, callers
	// match) as of a position `through`, which it returns ("" when the
	// stream is empty). h gets, in cursor order and in batches of at most
	// a few hundred, for every such subject its newest message at or
	// before through; a subject whose newest stored message is after
	// through may instead be left out (a Replay after through delivers
	// it). Deletes are delivered like any message (the caller decides). It
	// never delivers a message after through, nor one twice. h must not
	// keep the batch slice, which is reused (it may keep each Message's
	// Data). An error from h ends it with that error.
	//
	// limit > 0 bounds the snapshot, and what Latest holds while it reads
	// it: when more than limit subjects on filters hold a message (counted
	// at or after through: one first published after through may count),
	// Latest returns an error wrapping ErrSnapshotTooLarge, having
	// delivered at most limit messages (Redis Streams refuses before it
	// delivers any). limit <= 0: no bound.
	Latest(ctx context.Context, filters []string, limit int, h func([]Message) error) (through string, err error)
}

// ErrSnapshotTooLarge is wrapped by the error of a Latest whose filters
// match more subjects than its limit: the snapshot is refused rather than
// read whole (a pattern over millions of subjects).
var ErrSnapshotTooLarge = errors.New("snapshot too large")

// snapshotTooLarge is the error of a Latest over limit.
func snapshotTooLarge(limit int, filters []string) error {
	return fmt.Errorf("%w: more than %d subjects on %q", ErrSnapshotTooLarge, limit, filters)
}

// latestHooks let a test act between Latest's steps, where a publisher
// racing with it would change what it reads (export_test.go); nil
// outside tests.
type latestHooks struct {
	afterThrough func() // through is read, nothing else yet
	afterScan    func() // Redis Streams: the index is read, no entry yet
	// scanned is called after each page of the index Redis Streams reads,
	// with how many entries Latest holds then.
	scanned func(held int)
}

// HighWater is implemented by brokers that can say which of a writer's
// events they already store (JetStream, Redis Streams; not Core NATS,
// which keeps no history). A writer whose events have ids in publish
// order (the ingest: "<writer>:<commit LSN hex>-<index>") asks it at start
// and after every reconnect, and skips its events at or before the
// answer: exactly once without depending on the duplicate window, however
// long it was away. Append stores a prefix of what it is given, in order,
// even through failures (a message is never stored after a later one
// that was not), so every event appended before the last one stored is
// stored.
type HighWater interface {
	// LastID returns the ID (Outgoing.ID) of the newest message the broker
	// stores of those writer appended (AppendOptions.Writer), or "" when it
	// stores none. subjects are the patterns the writer publishes on,
	// within the broker's subject space. Messages of other publishers, on
	// those subjects or elsewhere, never count. A writer appends in order
	// and does not send again what LastID names as stored: a repeat that
	// the broker drops as a duplicate counts as stored (JetStream's mark
	// stays at the newest; Redis Streams records the repeat as the last).
	//
	// JetStream answers from the stream itself: the newest, by sequence,
	// of the last messages on each of subjects whose Nats-Msg-Id is the
	// writer's (read from the stream's leader, never a lagging replica); a
	// message the stream lost (a purge, max_age, max_msgs) is forgotten.
	// Redis Streams answers from a hash field per writer that each append
	// sets in the same script as its XADDs (the stream's own entries do
	// not keep ids); subjects do not matter there. An evicted hash is
	// forgotten.
	LastID(ctx context.Context, writer string, subjects []string) (string, error)
}

// Registry is implemented by brokers that keep a small document beside a
// stream, changed only by compare-and-set (JetStream: a key-value bucket;
// Redis Streams: a key beside the stream). The ingests keep their writers'
// records there: which subjects each publishes on, so that two ingests
// never publish the same subjects into one stream.
type Registry interface {
	// LoadRegistry returns the document and its revision (nil and 0 when
	// there is none yet).
	LoadRegistry(ctx context.Context) ([]byte, uint64, error)
	// StoreRegistry replaces the document if its revision is still rev (0:
	// there must be none) and returns the new revision; another writer's
	// change since gives an error wrapping ErrConflict.
	StoreRegistry(ctx context.Context, doc []byte, rev uint64) (uint64, error)
}

// Consumers is implemented by brokers that can keep a consumer per
// subscription on the server (JetStream): the server tracks its position,
// so a client can come back to a named (durable) one without holding a
// cursor. The ws role uses it for "durable" subscriptions and for
// --consumer per-connection.
type Consumers interface {
	Durable
	OpenConsumer(ctx context.Context, cfg ConsumerConfig) (Consumer, error)
}

// ConsumerConfig says which consumer to open.
type ConsumerConfig struct {
	// Filters are the patterns whose events the consumer delivers, within
	// the broker's subject space (the subscription's pattern, or the parts
	// of the subject space it intersects: the caller matches every message).
	Filters []string
	// Name binds a durable consumer of that name, creating it if it does
	// not exist; "" opens an ephemeral one, removed by Delete or when
	// unused for Inactive. It must match ValidConsumerName.
	Name string
	// Owner is the principal the durable belongs to (the gateway's: a
	// token's sub). The consumer's server-side name is DurableName(Owner,
	// Name): two owners naming the same durable get two consumers, and
	// neither can bind, move or delete the other's.
	Owner string
	// MaxDurables caps Owner's durable consumers on the stream (0: no
	// cap). Creating one more fails with an error wrapping
	// ErrTooManyConsumers; binding (or moving) an existing one never does.
	// The count is the broker's, so it holds across the nodes sharing it.
	MaxDurables int
	// From is where the consumer starts: "" = with the next event stored
	// (an existing durable: where it left off), "first" = with the first
	// retained, or a cursor = right after it (an existing durable is
	// moved there).
	From string
	// Inactive is how long the server keeps a consumer nobody reads from
	// (default: a minute for ephemeral consumers, a day for durable ones).
	Inactive time.Duration
}

// Consumer is one subscription's consumer on the broker. Its methods are
// called from one goroutine.
type Consumer interface {
	// Start is the cursor the consumer delivers after: the last event
	// before its first ("" when it starts with the first retained).
	Start() string
	// Bound reports whether an existing durable consumer was bound (its
	// own position, not ConsumerConfig.From, says where it starts).
	Bound() bool
	// Consume calls h with batches of messages in stream order, never one
	// twice, until ctx is done; and with an empty batch at least every
	// tick while none arrive, so that h can acknowledge. It returns why
	// it stopped.
	Consume(ctx context.Context, tick time.Duration, h func([]Message)) error
	// Ack tells the server that every message up to cursor has been
	// handled: a durable consumer bound later starts after it. It
	// acknowledges up to the last ack point at or before cursor: every
	// AckEvery-th message of a batch h received, and its last. With wait it
	// returns once the server has confirmed (use it for the last ack
	// before leaving), otherwise at once. Call it from h, or after Consume
	// returned.
	Ack(ctx context.Context, cursor string, wait bool) error
	// Delete removes the consumer from the server.
	Delete(ctx context.Context) error
}

// ErrBadConsumer is wrapped by errors about a consumer that cannot be
// opened as asked: a malformed name, or a durable consumer of that name
// with another filter.
var ErrBadConsumer = errors.New("bad consumer")

// ErrTooManyConsumers is wrapped by the error of a new durable consumer
// past its owner's ConsumerConfig.MaxDurables.
var ErrTooManyConsumers = errors.New("too many durable consumers")

// ErrUnsupported is wrapped by errors about what the broker's server is too
// old to do (a JetStream feature of a later nats-server): asking again
// cannot help, so a caller answers with the error instead of retrying.
var ErrUnsupported = errors.New("not supported by the broker's server")

// ValidConsumerName reports whether name can name a durable consumer: 1 to
// 64 letters, digits, '-' and '_'.
func ValidConsumerName(name string) bool {
	if len(name) == 0 || len(name) > 64 {
		return false
	}
	for _, r := range name {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
			return false
		}
	}
	return true
}

// AckEvery spaces a Consumer's ack points within a batch: a durable bound
// again after its connection ended repeats at most this many events its
// last connection had sent.
const AckEvery = 16
