package broker

import (
	"context"
	"errors"
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
	// Close releases the connection; it waits for the broker's goroutines.
	Close() error
}

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
