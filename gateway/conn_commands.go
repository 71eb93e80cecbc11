package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/fanwire/fanwire/gateway/auth"
	"github.com/fanwire/fanwire/gateway/internal/fanout"
	"github.com/fanwire/fanwire/gateway/internal/filter"
)

// The native protocol's commands, run by a connection's reader: subscribe,
// unsubscribe, ping, refresh and publish (clientpublish.go), and the
// replies they queue.

func (c *conn) handle(data []byte) {
	f, err := parseClientFrame(data)
	if err != nil {
		id, code := errorReply(f, err)
		c.clientError(id, code, err.Error())
		return
	}
	switch f.Type {
	case "subscribe":
		c.subscribe(*f.ID, *f.Subject, f.From, f.Durable, f.Where, f.Presence != nil && *f.Presence)
	case "unsubscribe":
		c.unsubscribe(*f.ID)
	case "ping":
		c.send(pongMessage)
	case "refresh":
		c.refresh(deref(f.ID), *f.Token)
	case "publish":
		c.publish(*f.ID, *f.Subject, f.Data)
	case "track":
		c.track(*f.ID, *f.Subject, f.State, deref(f.Resume))
	case "untrack":
		c.untrack(*f.ID, *f.Subject)
	case "members":
		c.members(*f.ID, *f.Subject, f.After, f.Limit)
	}
}

// refresh replaces the connection's token: its grants apply from now on,
// to the subscriptions it has too, and its expiry moves. A refused token
// is an error (code unauthorized) and changes nothing: the connection
// keeps its old token until that expires. id (may be empty) is the
// refresh's, echoed in the reply. See refreshRefusal for what a new token
// may not do.
func (c *conn) refresh(id, token string) {
	auth := c.s.cfg.Authenticate
	if auth == nil {
		c.clientError(id, CodeUnauthorized, "this gateway does not authenticate connections: nothing to refresh")
		return
	}
	token = bareToken(token)
	if token == "" {
		// An Authenticator takes no token for an anonymous connection
		// (JWTAuth with AllowAnonymous), which would lift the expiry.
		c.clientError(id, CodeUnauthorized, "refresh: the token is empty")
		return
	}
	payload, _ := json.Marshal(map[string]string{"token": token})
	grants, err := auth(c.runCtx, c.req, payload)
	if err != nil {
		c.clientError(id, CodeUnauthorized, err.Error())
		return
	}
	if why := refreshRefusal(c.grants, grants); why != "" {
		c.clientError(id, CodeUnauthorized, "refresh: "+why)
		return
	}
	c.revokeUncovered(grants)
	c.revokePresence(grants)
	c.setGrants(grants)
	c.armExpiry()
	var exp time.Time
	if grants != nil {
		exp = grants.Expires
	}
	c.send(refreshedMessage(id, exp))
}

// bareToken is a refresh's token without surrounding space and its
// optional "Bearer " scheme.
func bareToken(s string) string {
	s = strings.TrimSpace(s)
	if len(s) >= 6 && strings.EqualFold(s[:6], "bearer") && (len(s) == 6 || s[6] == ' ') {
		s = strings.TrimSpace(s[6:])
	}
	return s
}

// refreshRefusal says why the grants of a refresh may not replace the
// connection's (old), or "" when they may. A refresh renews one identity's
// token: its durables and publish grants are its sub's, so another sub,
// or an anonymous connection turning into a token's (or back), needs a
// connection of its own. And a token that expires is never replaced by
// one that does not: refused rather than keeping the old expiry, so the
// client is not told its connection lasts longer than it will.
func refreshRefusal(old, grants *auth.Grants) string {
	wasAnon, isAnon := old == nil || old.Anonymous, grants == nil || grants.Anonymous
	switch {
	case wasAnon && !isAnon:
		return "this connection is anonymous: connect again with the token"
	case !wasAnon && isAnon:
		return "the authenticator admitted it as anonymous, not as a token of this connection's sub"
	case !wasAnon && grants.Subject != old.Subject:
		return `the token's "sub" is not this connection's: a refresh renews one identity's token (its durables and publish grants are that sub's); connect again with it`
	case old != nil && !old.Expires.IsZero() && (grants == nil || grants.Expires.IsZero()):
		return `the token has no "exp" and this connection's token expires: a refresh cannot lift the expiry`
	}
	return ""
}

// revokeUncovered ends, with an error revoked naming each, the
// subscriptions that grants do not cover, in the order of their ids. The
// others go on untouched. Revocations are counted as client errors but are
// not the client's: they do not count towards MaxClientErrors.
func (c *conn) revokeUncovered(grants *auth.Grants) {
	c.subsMu.Lock()
	var ids []string
	for id, st := range c.subs {
		if !grants.Allows(st.pattern) || !st.watchOnly && c.grantChanged(st, grants) || st.presence && presenceFiltered(grants, st.pattern) != "" {
			ids = append(ids, id)
		}
	}
	c.subsMu.Unlock()
	slices.Sort(ids)
	for _, id := range ids {
		c.subsMu.Lock()
		st := c.subs[id]
		c.subsMu.Unlock()
		if st == nil { // its task failed it meanwhile, and said so
			continue
		}
		msg := "subscription " + strconv.Quote(id) + " on " + strconv.Quote(st.pattern) + " ended: the refreshed token does not grant it"
		if grants.Allows(st.pattern) {
			msg = "subscription " + strconv.Quote(id) + " on " + strconv.Quote(st.pattern) + " ended: the refreshed token changes its row filter (or a claim the filter reads): subscribe again"
		}
		if c.endSubscription(id, st, true, func() []byte { return c.errorMsg(id, CodeRevoked, msg) }) {
			c.s.metrics.ClientErrors.WithLabelValues(CodeRevoked).Inc()
		}
	}
}

// grantChanged reports whether new grants filter st's pattern otherwise
// than the grants it was admitted with: another row filter, or other
// values of the claims that filter reads. The caller holds subsMu.
func (c *conn) grantChanged(st *subState, grants *auth.Grants) bool {
	var old *filter.Expr
	var oldClaims map[string]any
	if f := st.filter(); f != nil {
		old, oldClaims = f.Grant(), f.Claims()
	}
	text := auth.FilterText(grants, st.pattern)
	if old == nil || text == "" {
		return (old == nil) != (text == "")
	}
	ce, err := c.s.exprs.Compile(text)
	if err != nil {
		return true
	}
	var claims map[string]any
	if grants != nil {
		claims = grants.Claims
	}
	return filter.GrantKey(old, oldClaims) != filter.GrantKey(ce, claims)
}

// armExpiry (re)starts the timer that closes the connection with 4001 when
// its token expires. The reader calls it (start, connection_init, refresh).
func (c *conn) armExpiry() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.expiry != nil {
		c.expiry.Stop()
		c.expiry = nil
	}
	if c.grants == nil || c.grants.Expires.IsZero() || c.closed {
		return
	}
	c.expiry = time.AfterFunc(time.Until(c.grants.Expires), func() {
		c.closeWith(CloseTokenExpired, "token expired: reconnect with a new one")
	})
}

// admitSubscription checks a new subscription id to pattern (a native
// subscribe, a GraphQL events or presence subscription): a new id, under
// MaxSubscriptions, a valid pattern in the subject space that the grants
// allow. A refusal is answered with a client error.
func (c *conn) admitSubscription(id, pattern string) bool {
	c.subsMu.Lock()
	_, dup := c.subs[id]
	n := len(c.subs)
	c.subsMu.Unlock()
	if dup {
		c.clientError(id, CodeDuplicateID, "subscription id "+id+" is already active")
		return false
	}
	if n >= c.s.cfg.MaxSubscriptions {
		c.clientError(id, CodeTooManySubscriptions, "at most "+strconv.Itoa(c.s.cfg.MaxSubscriptions)+" subscriptions per connection")
		return false
	}
	if err := c.s.checkPattern(pattern); err != nil {
		c.clientError(id, CodeBadPattern, err.Error())
		return false
	}
	if !c.grants.Allows(pattern) {
		c.clientError(id, CodeForbidden, "this connection's token does not grant "+strconv.Quote(pattern))
		return false
	}
	if err := c.s.checkSystemPattern(pattern, c.grants); err != nil {
		c.clientError(id, CodeForbidden, err.Error())
		return false
	}
	return true
}

func (c *conn) subscribe(id, pattern string, from, durable, where *string, presence bool) {
	if !c.admitSubscription(id, pattern) {
		return
	}
	if msg := presenceFiltered(c.grants, pattern); presence && msg != "" {
		c.clientError(id, CodeForbidden, "presence: "+msg)
		return
	}
	f, code, err := c.subscriptionFilter(pattern, where)
	if err != nil {
		c.clientError(id, code, err.Error())
		return
	}
	latest := from != nil && *from == "latest"
	if durable != nil || (c.s.cfg.Consumer == ConsumerPerConnection && f == nil && !latest) {
		c.startFeed(id, pattern, from, durable, f)
		return
	}
	if from != nil {
		c.startResume(id, pattern, *from, f)
		return
	}
	if f != nil {
		c.startLiveView(id, pattern, f, presence)
		return
	}
	st := &subState{pattern: pattern, live: true, presence: presence}
	c.subsMu.Lock()
	c.subs[id] = st
	c.subsMu.Unlock()
	// The reply is queued while the index is held: no event for the
	// subscription can precede it, the client cannot see it before the
	// subscription is live, and the cursor it carries (durable brokers) is
	// exactly the last event dispatched before it. Its presence watch
	// starts after the reply, so no presence message precedes it either.
	var wake bool
	c.s.hub.Subscribe(c.cl, id, pattern, func() {
		wake = c.queue(c.subscribedMsg(id, c.s.hub.LastCursor()))
		if presence {
			c.s.pres.Watch(&c.pc, id, pattern)
		}
	})
	if wake {
		c.cl.Signal()
	}
	c.s.metrics.Subscriptions.Inc()
}

// subscriptionFilter is the filter of a subscription to pattern: its
// grant's row filter (auth.FilterText) and its own where, both of which
// must accept an event; nil when neither filters. A where that does not
// compile is bad_filter, naming the position; a grant's filter that does
// not is forbidden (the token grants nothing it could check). A where the
// node does not hold yet is compiled within the connection's
// FilterCompileRate (rate_limited past it), and the compiled programs the
// connection's subscriptions hold stay under maxConnExprBytes
// (filter_too_costly past it, as while the connection's filters are past
// Config.FilterCostRate).
func (c *conn) subscriptionFilter(pattern string, where *string) (*filter.Filter, string, error) {
	var grant, own *filter.Expr
	if text := auth.FilterText(c.grants, pattern); text != "" {
		ce, err := c.s.exprs.Compile(text) // the operator's text, in a signed token
		if err != nil {
			return nil, CodeForbidden, fmt.Errorf("the token's row filter for %q does not compile (%v): it grants nothing", pattern, err)
		}
		grant = ce
	}
	if where != nil {
		own = c.s.exprs.Lookup(*where)
		if own == nil {
			rate := c.s.cfg.FilterCompileRate
			if !c.compiles.Take(time.Now(), float64(rate), float64(max(rate, c.s.cfg.MaxSubscriptions)), 1, false) {
				return nil, CodeRateLimited, filter.ErrCompileRate{Rate: rate}
			}
			ce, err := c.s.exprs.Compile(*where)
			if err != nil {
				return nil, CodeBadFilter, fmt.Errorf("where: %w", err)
			}
			own = ce
		}
	}
	if grant == nil && own == nil {
		return nil, "", nil
	}
	if w := c.filters.Owed(c.s.hub.Now()); w > 0 {
		return nil, CodeFilterTooCostly, fmt.Errorf("this connection's filters spent more than --filter-cost-rate (%d cost units a second) allows: subscribe with a filter again in %s", c.s.cfg.FilterCostRate, w.Round(time.Millisecond))
	}
	if n := c.exprBytes(grant, own); n > maxConnExprBytes {
		return nil, CodeFilterTooCostly, fmt.Errorf("where: this connection's filters would hold about %d KiB of compiled programs, over %d KiB: unsubscribe some, or share texts (equal filters cost one)", n>>10, maxConnExprBytes>>10)
	}
	var claims map[string]any
	if c.grants != nil {
		claims = c.grants.Claims
	}
	return c.s.filters.Get(grant, own, claims), "", nil
}

// maxConnExprBytes bounds the compiled expressions one connection's
// subscriptions hold (estimated sizes, each distinct expression once):
// 256 typical filters (about 10 KiB each) fit; 256 of the largest (2 KiB
// of text, about 100 KiB compiled) would hold 25 MiB.
const maxConnExprBytes = 8 << 20

// exprBytes is the estimated memory of the distinct expressions the
// connection's subscriptions hold, with more added.
func (c *conn) exprBytes(more ...*filter.Expr) int {
	seen := make(map[*filter.Expr]struct{})
	n := 0
	add := func(ce *filter.Expr) {
		if ce == nil {
			return
		}
		if _, ok := seen[ce]; !ok {
			seen[ce] = struct{}{}
			n += ce.Size()
		}
	}
	for _, ce := range more {
		add(ce)
	}
	c.subsMu.Lock()
	for _, st := range c.subs {
		if f := st.filter(); f != nil {
			add(f.Grant())
			add(f.Where())
		}
	}
	c.subsMu.Unlock()
	return n
}

// startLiveView starts a filtered subscription without history: it holds
// nothing yet, and gets the events its filter accepts from now on (and a
// leave for each document it was sent that stops passing).
func (c *conn) startLiveView(id, pattern string, f *filter.Filter, presence bool) {
	vs := c.newViewSub(id, pattern, f)
	st := &subState{pattern: pattern, live: true, view: vs, presence: presence}
	c.subsMu.Lock()
	c.subs[id] = st
	c.subsMu.Unlock()
	vs.OnEnd = func(code string) { c.viewEnded(id, st, code) }
	var wake bool
	c.s.hub.Locked(func(tx fanout.Tx) bool {
		tx.AddView(vs)
		wake = c.queue(c.subscribedMsg(id, c.s.hub.LastCursor()))
		if presence {
			c.s.pres.Watch(&c.pc, id, pattern)
		}
		return true
	})
	if wake {
		c.cl.Signal()
	}
	c.s.metrics.Subscriptions.Inc()
}

func (c *conn) newViewSub(id, pattern string, f *filter.Filter) *fanout.View {
	return &fanout.View{Client: c.cl, ID: id, Pattern: pattern, Filter: f, Subs: c.cl.SubsFor([]string{id}),
		Max: c.s.cfg.MaxSnapshot, Lim: c.s.hub.HeldLimits(), Budget: c.filters, Held: make(map[string]struct{})}
}

// viewEnded ends a live view that passed a bound (the dispatcher's call,
// outside the index lock): Config.MaxSnapshot documents (view_too_large),
// or its connection's Config.MaxFilterCostPerEvent (filter_too_costly).
func (c *conn) viewEnded(id string, st *subState, code string) {
	c.subsMu.Lock()
	if c.subs[id] != st {
		c.subsMu.Unlock()
		return
	}
	delete(c.subs, id)
	c.subsMu.Unlock()
	if st.presence {
		c.s.pres.Unwatch(&c.pc, id)
	}
	msg := c.s.viewTooLargeText(id, st.view.Full)
	if code == CodeFilterTooCostly {
		msg = c.s.filterTooCostlyText(id)
	}
	var wake bool
	if c.s.hub.RemoveView(st.view, func() { wake = c.queue(c.errorMsg(id, code, msg)) }) {
		c.s.metrics.Subscriptions.Dec()
	}
	c.s.metrics.ClientErrors.WithLabelValues(code).Inc()
	if wake {
		c.cl.Signal()
	}
}

// viewTooLargeText says which bound on held documents subscription id
// passed (View.Full).
func (s *Server) viewTooLargeText(id, full string) string {
	switch full {
	case fanout.FullConn:
		return "subscription " + strconv.Quote(id) + ": this connection's views would hold more than " + strconv.Itoa(s.cfg.MaxViewDocumentsPerConnection) + " documents together (--max-view-documents-per-connection): end a view, or narrow its subject or where"
	case fanout.FullNode:
		return "subscription " + strconv.Quote(id) + ": this node's views hold " + strconv.Itoa(s.cfg.MaxViewDocuments) + " documents (--max-view-documents): narrow its subject or where, or try another node"
	case fanout.FullScan:
		return "subscription " + strconv.Quote(id) + ": its subject covers more than " + strconv.Itoa(fanout.FilteredSnapshotScan*s.cfg.MaxSnapshot) + " stored subjects (" + strconv.Itoa(fanout.FilteredSnapshotScan) + " × --max-snapshot), more than a filtered snapshot reads: narrow its subject"
	}
	return "subscription " + strconv.Quote(id) + ": its view passed " + strconv.Itoa(s.cfg.MaxSnapshot) + " documents (--max-snapshot): narrow its subject or where"
}

func (s *Server) filterTooCostlyText(id string) string {
	return "subscription " + strconv.Quote(id) + " ended: its filter took this connection's filters past " + strconv.Itoa(s.cfg.MaxFilterCostPerEvent) + " cost units for one event (--max-filter-cost-per-event): simplify its where, or hold fewer filtered subscriptions (equal filters are evaluated once)"
}

func (c *conn) unsubscribe(id string) {
	c.subsMu.Lock()
	st, ok := c.subs[id]
	c.subsMu.Unlock()
	if !ok {
		c.clientError(id, CodeUnknownID, "no active subscription with id "+id)
		return
	}
	c.endSubscription(id, st, false, func() []byte { return c.unsubscribedMsg(id) })
}

// endSubscription ends subscription id (st) and queues reply's message
// after every event that lists it, and before any that could follow. A
// client's unsubscribe deletes a durable's consumer; a revocation keeps it
// (it is the principal's, as when its connection ends). A revoked
// subscription that ended by itself meanwhile (its replay or feed failed,
// with an error for the client) is left alone: it reports false.
func (c *conn) endSubscription(id string, st *subState, revoked bool, reply func() []byte) bool {
	if st.task != nil { // a replay or a feed: stop it first
		st.task.cancel()
		<-st.task.done
	}
	c.subsMu.Lock()
	if revoked && c.subs[id] != st {
		c.subsMu.Unlock()
		return false
	}
	if st.presence {
		// Before the reply: no presence message queued after it lists id.
		c.s.pres.Unwatch(&c.pc, id)
	}
	delete(c.subs, id)
	live := st.live
	c.subsMu.Unlock()
	var wake bool
	if st.feed != nil {
		ctx, cancel := context.WithTimeout(context.Background(), feedEndTimeout)
		c.endFeed(ctx, st.feed, !revoked)
		cancel()
		if live {
			c.s.metrics.Subscriptions.Dec()
		}
		wake = c.queue(reply())
	} else if live && st.watchOnly {
		c.s.metrics.Subscriptions.Dec()
		wake = c.queue(reply())
	} else if live && st.view != nil {
		c.s.hub.RemoveView(st.view, func() { wake = c.queue(reply()) })
		c.s.metrics.Subscriptions.Dec()
	} else if live {
		// The reply is queued while the index is held: it follows every
		// event that lists the id, and none follows it.
		c.s.hub.Unsubscribe(c.cl, id, st.pattern, func() { wake = c.queue(reply()) })
		c.s.metrics.Subscriptions.Dec()
	} else {
		wake = c.queue(reply())
	}
	if wake {
		c.cl.Signal()
	}
	return true
}

// subscribedMsg is the reply to a subscribe (none in GraphQL).
func (c *conn) subscribedMsg(id, cursor string) []byte {
	if c.gql != nil {
		return nil
	}
	return subscribedMessage(id, cursor)
}

// unsubscribedMsg is the reply to an unsubscribe (none in GraphQL: the
// client's complete needs no answer).
func (c *conn) unsubscribedMsg(id string) []byte {
	if c.gql != nil {
		return nil
	}
	return replyMessage("unsubscribed", id)
}

// errorMsg is a client error: in GraphQL it ends operation id (an error
// without an id is a protocol error, which closes the connection instead).
func (c *conn) errorMsg(id, code, msg string) []byte {
	if c.gql == nil {
		return errorMessage(id, code, msg)
	}
	c.gql.forget(id)
	return c.gql.errorMessage(id, code, msg)
}
