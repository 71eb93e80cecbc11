package gateway

import (
	"context"

	"github.com/fanwire/fanwire/gateway/internal/fanout"
	"github.com/fanwire/fanwire/gateway/internal/filter"
)

// subState is one subscription of a connection.
type subState struct {
	pattern   string
	view      *fanout.View // a filtered subscription: in the view index once live, not the index
	grant     string       // the grant's row filter it was admitted with (and its claims), to re-check on refresh
	live      bool         // in the index, its feed is running, or (watchOnly) it watches; guarded by conn.subsMu
	waiting   bool         // its replay or hand-over waits for the client to read (waitForClient); guarded by conn.subsMu
	task      *taskState   // the goroutine of a resume or a feed; static after creation
	feed      *feedState   // set when the subscription has its own consumer; static after creation
	presence  bool         // it watches presence too (package internal/presence); static
	watchOnly bool         // a GraphQL presence subscription: a presence watch, in no index (graphql_presence.go); static
}

// filter is the subscription's filter (nil: none).
func (st *subState) filter() *filter.Filter {
	switch {
	case st.view != nil:
		return st.view.Filter
	case st.feed != nil && st.feed.view != nil:
		return st.feed.view.Filter
	}
	return nil
}

// waitForClient runs wait, a wait for room in c's mailbox, with st marked
// waiting for as long as it takes (the inspector shows it: a replay, a
// feed or a view's synced held up by a client that does not read).
func (c *conn) waitForClient(st *subState, wait func() error) error {
	c.subsMu.Lock()
	st.waiting = true
	c.subsMu.Unlock()
	defer func() {
		c.subsMu.Lock()
		st.waiting = false
		c.subsMu.Unlock()
	}()
	return wait()
}

// taskState is a subscription's goroutine: a resume (replay, then hand-over
// to the hub) or a feed (its own consumer).
type taskState struct {
	cancel context.CancelFunc
	done   chan struct{} // closed when the resume goroutine has exited
}
