package loadtest

import (
	"fmt"
	"strconv"
)

// Filtered subscriptions (Config.Where). The events are the rows of a
// table: event seq (from 1) updates document d = (seq-1) mod (Clients ×
// WhereDocs), which belongs to customer k = d mod Clients and is row
// j = d / Clients of that customer, on subject <Subject>.<k>.<j> (the view's
// key, as the ingest publishes one subject per row), with data
//
//	{"seq":N,"ts":T,"doc":{"customer_id":k,"total":k.5},"pad":"xx…"}
//
// Client i is a view of customer i's rows, so every event goes to exactly
// one client, and a document never leaves a view (its customer never
// changes): client i must get exactly the events with seq ≡ i+1 (mod
// Clients), in order, none twice, and no leave.
const (
	// WhereEq: client i subscribes to <Subject>.*.* where
	// "doc.customer_id == i", which the gateway indexes on the value:
	// an event reaches only the subscription whose constant it carries.
	WhereEq = "eq"
	// WhereRange: where "doc.total >= i && doc.total < i + 1", which has
	// no equality to index on: the gateway evaluates every such filter
	// for every event.
	WhereRange = "range"
	// WhereSubject: no filter; client i subscribes to <Subject>.<i>.*,
	// the same deliveries routed by the subject alone (the baseline the
	// two filters are compared with).
	WhereSubject = "subject"
)

// DefaultWhereDocs is how many documents (rows) each client's view holds
// by default.
const DefaultWhereDocs = 1

// subscription is what one client subscribes to.
type subscription struct {
	subject string
	from    string // "" live, "latest", "first" or a cursor
	where   string // "" unfiltered
	own     string // Config.OwnPattern: a second subscription's pattern (id ownSubID), live; "" none
}

// viewRun reports whether the run's clients are views (Config.Where).
func (c *Config) viewRun() bool { return c.Where != "" }

// clientSub is client i's subscription.
func (c *Config) clientSub(i int) subscription {
	switch c.Where {
	case WhereEq:
		return subscription{subject: c.Subject + ".*.*", where: "doc.customer_id == " + strconv.Itoa(i)}
	case WhereRange:
		return subscription{subject: c.Subject + ".*.*", where: fmt.Sprintf("doc.total >= %d && doc.total < %d", i, i+1)}
	case WhereSubject:
		return subscription{subject: c.Subject + "." + strconv.Itoa(i) + ".*"}
	}
	s := subscription{subject: c.Subject}
	if c.OwnPattern {
		s.own = c.Subject + ".own." + strconv.Itoa(i) + ".>"
	}
	return s
}

// docOf returns the customer and row of event seq's document (view runs).
func (c *Config) docOf(seq uint64) (customer, row uint64) {
	n := uint64(c.Clients)
	d := (seq - 1) % (n * uint64(c.WhereDocs))
	return d % n, d / n
}

// appendDocSubject appends event seq's subject (view runs) to dst.
func (c *Config) appendDocSubject(dst []byte, seq uint64) []byte {
	k, j := c.docOf(seq)
	dst = append(dst, c.Subject...)
	dst = append(dst, '.')
	dst = strconv.AppendUint(dst, k, 10)
	dst = append(dst, '.')
	return strconv.AppendUint(dst, j, 10)
}

// clientEvents is how many of the run's events client i must receive.
func (c *Config) clientEvents(i int) int {
	if !c.viewRun() {
		return int(c.perClient())
	}
	n := c.Events / c.Clients
	if i < c.Events%c.Clients {
		n++
	}
	return n
}

// expectedTotal is how many deliveries the run expects over all clients.
func (c *Config) expectedTotal() int64 {
	if c.viewRun() {
		return int64(c.Events) // each event goes to exactly one client
	}
	return int64(c.Clients) * c.perClient()
}

// newClientVerifier is client i's verifier.
func (c *Config) newClientVerifier(i int) verifier {
	switch {
	case c.viewRun():
		return newStrideVerifier(c.clientEvents(i), c.Clients, i)
	case c.clientsPublish(): // every client publishes Events of its own
		return newMultiVerifier(c.Clients, c.Events)
	}
	return newVerifier(c.Events)
}

// validateWhere checks Where and what it cannot be combined with.
func (c *Config) validateWhere() error {
	switch {
	case c.WhereDocs < 0:
		return fmt.Errorf("%w: WhereDocs %d is negative", ErrInvalidConfig, c.WhereDocs)
	case !c.viewRun():
		return nil
	case c.Where != WhereEq && c.Where != WhereRange && c.Where != WhereSubject:
		return fmt.Errorf("%w: Where %q: want eq, range or subject", ErrInvalidConfig, c.Where)
	case c.Proto != ProtoNative:
		return fmt.Errorf("%w: Where needs Proto native, not %q", ErrInvalidConfig, c.Proto)
	case c.clientsPublish() || c.ResumeShare > 0 || c.Churn > 0:
		return fmt.Errorf("%w: Where is a test of its own: drop PublishVia, ResumeShare and Churn", ErrInvalidConfig)
	case c.Clients == 0:
		return fmt.Errorf("%w: Where needs Clients", ErrInvalidConfig)
	case c.Events < c.Clients:
		// A client with no event would never finish.
		return fmt.Errorf("%w: Events %d with Where is fewer than Clients %d: every client must get an event", ErrInvalidConfig, c.Events, c.Clients)
	}
	return nil
}
