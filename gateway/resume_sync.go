package gateway

import (
	"errors"
	"fmt"

	"github.com/fanwire/fanwire/gateway/internal/fanout"
	"github.com/fanwire/fanwire/jsonstr"
)

// The end of a view's or a resume's history: its synced marker (the
// subjects a filtered view holds), within the mailbox's bound, and the
// hand-over to the hub with nothing being dispatched.

// errSyncedTooLarge fails a view's resume whose synced (every subject the
// view holds) is more than the connection's mailbox holds.
var errSyncedTooLarge = errors.New("the view's synced is over --mailbox-bytes")

// syncedTooLarge is errSyncedTooLarge for a view of n subjects whose
// synced takes size bytes, worded for its client.
func (s *Server) syncedTooLarge(n, size int) error {
	return fmt.Errorf("%w: the view holds %d subjects, and its synced listing them takes %d bytes, more than this connection's queue holds (--mailbox-bytes %d): raise --mailbox-bytes, or narrow the view (its pattern or where)",
		errSyncedTooLarge, n, size, s.cfg.MailboxBytes)
}

// sendsSynced reports whether subscription id is sent its synced (in
// GraphQL, an operation that asked for the markers).
func (c *conn) sendsSynced(id string) bool {
	if c.gql == nil {
		return true
	}
	op := c.gql.op(id)
	return op != nil && op.markers
}

// syncedBytes is at most what the synced of view id (on pattern) takes
// in the mailbox, its keys taking keysBytes, with a cursor about as long
// as cur.
func (c *conn) syncedBytes(id, pattern, cur string, keysBytes int) int {
	n := len(`{"type":"synced","id":,"cursor":,"keys":[]}`) + jsonstr.Len(id) + jsonstr.Len(cur) + 16 + keysBytes
	if c.gql != nil { // the pattern, and the operation's next message around it
		n += jsonstr.Len(pattern)
		if op := c.gql.op(id); op != nil {
			n += op.overhead
		}
	}
	return n
}

// queueSynced queues subscription id's synced: a control message, or in
// GraphQL an Event of kind SYNCED through its operation. It reports
// whether to wake the writer.
func (c *conn) queueSynced(id, pattern, cursor string, keys []string) bool {
	if c.gql == nil {
		return c.queue(syncedMessage(id, cursor, keys))
	}
	if op := c.gql.op(id); op == nil || !op.markers {
		return false
	}
	ev := gqlSyncedEvent(pattern, cursor, keys)
	it := fanout.Item{Ev: ev, Subs: c.cl.SubsFor([]string{id})}
	// The keys are written beside the event's bytes: counted here.
	wasEmpty, _, err := c.cl.Mailbox.Push(it, it.Size()+len(gqlKeysJSON(ev)))
	if err != nil {
		c.overflow()
		return false
	}
	return wasEmpty
}
