package fanout

import "sync/atomic"

// Client is the hub's view of a connection: a mailbox and a way to wake
// its writer. The transport owns the writer; it sets the hooks before the
// client is registered (Subscribe, a View), and never changes them after.
type Client struct {
	Mailbox Mailbox // first: the dispatcher touches its first 48 bytes on every delivery
	// Wake is what the writer waits on: Signal sends on it when a push
	// found the mailbox empty. Static; capacity 1, so a pending wake-up
	// is sticky.
	Wake chan struct{}

	// OnOverflow is called once, outside the index lock, when a push
	// fails (Overflowed turns true): the transport closes the connection
	// as a slow consumer. Static after NewClient.
	OnOverflow func()
	// OnWake, if set, runs after each wake signal (the transport starts a
	// writer if none runs). Set before the client is registered.
	OnWake func()
	// OnBehind, if set, is called by the dispatcher when the mailbox is
	// over half full (a shared flusher serves the connection sooner). Set
	// before the client is registered.
	OnBehind func()
	// Encode, if set, builds the subscription list of a delivery from the
	// ids of the client's matching subscriptions (GraphQL); nil: the
	// native protocol's JSON array of ids. Set before the client subscribes.
	Encode func(ids []string) *SubsList

	Overflowed atomic.Bool // set by whoever saw the push fail first, which then calls OnOverflow

	wakePending bool // owned by the dispatcher: already on this batch's wake list
	pacePending bool // owned by the dispatcher: already on this batch's pace list

	// Pad to 128 bytes: the allocator places 128-byte objects on 128-byte
	// boundaries, so the mailbox's hot fields share one cache line.
	_ [16]byte
}

// NewClient makes a client whose mailbox holds at most maxItems items
// and maxBytes bytes; onOverflow is its OnOverflow.
func NewClient(maxItems, maxBytes int, onOverflow func()) *Client {
	c := &Client{
		Wake:       make(chan struct{}, 1),
		OnOverflow: onOverflow,
	}
	c.Mailbox.Init(maxItems, maxBytes)
	return c
}

// SubsFor is the subscription list for a delivery to the subscriptions ids.
func (c *Client) SubsFor(ids []string) *SubsList {
	if c.Encode != nil {
		return c.Encode(ids)
	}
	return EncodeSubsList(ids)
}

// NeverFits reports whether a delivery of n bytes is over the mailbox's
// byte bound: it would not fit even in an empty mailbox.
func (c *Client) NeverFits(n int) bool { return n > c.Mailbox.MaxBytes() }

// Signal wakes the writer; it never blocks.
func (c *Client) Signal() {
	select {
	case c.Wake <- struct{}{}:
	default:
	}
	if c.OnWake != nil {
		c.OnWake()
	}
}
