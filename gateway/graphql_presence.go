package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"

	"github.com/99designs/gqlgen/graphql"
	"github.com/fanwire/fanwire/gateway/internal/fanout"
	"github.com/fanwire/fanwire/gateway/internal/presence"
	"github.com/fanwire/fanwire/schema"
	"github.com/vektah/gqlparser/v2/gqlerror"
)

// Presence in GraphQL: the track and untrack mutations (a WebSocket
// connection only: the connection is the member), the members query, and
// the presence subscription, a presence watch of the connection
// (presence.watch, keyed by the operation id) whose changes are spliced
// into next messages as events are (graphql_splice.go): a change is
// encoded once for every GraphQL watcher (presParts), then each operation
// splices those bytes into its own template.

// presParts is a presence change's values as GraphQL writes them, built
// once per change (presence.deliverLocked) when a GraphQL connection
// watches its subject, and shared read-only by every delivery.
type presParts struct {
	count []byte
	lists [3][]presMember // joins, leaves, updates
}

// presMember is one member's values as JSON (slices of its native
// encoding): sub and state are null when absent (anonymous, a leave).
type presMember struct {
	conn, sub, state []byte
}

// newPresParts builds the GraphQL values of changes to a subject that has
// count members after them.
func newPresParts(count int, changes []presence.Change) *presParts {
	p := &presParts{count: strconv.AppendInt(nil, int64(count), 10)}
	for _, ch := range changes {
		i := 0
		switch ch.Op {
		case presence.OpLeave:
			i = 1
		case presence.OpUpdate:
			i = 2
		}
		p.lists[i] = append(p.lists[i], splitMember(ch.Enc))
	}
	return p
}

// splitMember takes a member's native encoding (memberJSON:
// {"conn":…[,"sub":…][,"state":…]}) apart.
func splitMember(enc []byte) presMember {
	m := presMember{sub: fanout.NullJSON, state: fanout.NullJSON}
	const connKey, subKey, stateKey = `{"conn":`, `,"sub":`, `,"state":`
	i := len(connKey)
	end := jsonStringEnd(enc, i)
	m.conn = enc[i:end]
	i = end
	if hasPrefixAt(enc, i, subKey) {
		i += len(subKey)
		end = jsonStringEnd(enc, i)
		m.sub = enc[i:end]
		i = end
	}
	if hasPrefixAt(enc, i, stateKey) {
		m.state = enc[i+len(stateKey) : len(enc)-1]
	}
	return m
}

func hasPrefixAt(b []byte, i int, prefix string) bool {
	return len(b)-i >= len(prefix) && string(b[i:i+len(prefix)]) == prefix
}

// jsonStringEnd is the end of the JSON string that starts at b[i] (its
// opening quote).
func jsonStringEnd(b []byte, i int) int {
	for j := i + 1; j < len(b); j++ {
		switch b[j] {
		case '\\':
			j++
		case '"':
			return j + 1
		}
	}
	return len(b)
}

// Member field kinds of a memberShape.
const (
	memberConn = iota
	memberSub
	memberState
	memberTypename
)

// memberShape is the selection of a member list (joins, leaves, updates)
// as a template: pieces[0], value kinds[0], ..., pieces[len(kinds)].
type memberShape struct {
	pieces [][]byte
	kinds  []uint8
	fixed  int // the pieces' total length
}

func (m *memberShape) appendList(dst []byte, ms []presMember) []byte {
	dst = append(dst, '[')
	for i, mb := range ms {
		if i > 0 {
			dst = append(dst, ',')
		}
		for j, k := range m.kinds {
			dst = append(dst, m.pieces[j]...)
			switch k {
			case memberConn:
				dst = append(dst, mb.conn...)
			case memberSub:
				dst = append(dst, mb.sub...)
			case memberState:
				dst = append(dst, mb.state...)
			case memberTypename:
				dst = append(dst, `"Member"`...)
			}
		}
		dst = append(dst, m.pieces[len(m.kinds)]...)
	}
	return append(dst, ']')
}

// listLen is len(m.appendList(nil, ms)).
func (m *memberShape) listLen(ms []presMember) int {
	n := 2
	if len(ms) > 1 {
		n += len(ms) - 1
	}
	for _, mb := range ms {
		n += m.fixed
		for _, k := range m.kinds {
			switch k {
			case memberConn:
				n += len(mb.conn)
			case memberSub:
				n += len(mb.sub)
			case memberState:
				n += len(mb.state)
			case memberTypename:
				n += len(`"Member"`)
			}
		}
	}
	return n
}

// newMemberShape builds the template of a member list's selection, or nil
// when it needs the executor.
func newMemberShape(fields []graphql.CollectedField) *memberShape {
	m := &memberShape{}
	cur := []byte{'{'}
	for i, f := range fields {
		if len(f.Deferrables) > 0 || len(f.Selections) > 0 {
			return nil
		}
		var k uint8
		switch f.Name {
		case "conn":
			k = memberConn
		case "sub":
			k = memberSub
		case "state":
			k = memberState
		case "__typename":
			k = memberTypename
		default:
			return nil
		}
		cur = aliasPiece(cur, i, f.Alias)
		m.pieces = append(m.pieces, cur)
		m.kinds = append(m.kinds, k)
		m.fixed += len(cur)
		cur = nil
	}
	m.pieces = append(m.pieces, []byte{'}'})
	m.fixed++
	return m
}

// newFastPresenceOp builds the next-message template of a presence
// subscription, as newFastOp does for events; nil when the selection
// needs the executor.
func newFastPresenceOp(opCtx *graphql.OperationContext, id string, legacy bool, root graphql.CollectedField) *gqlOp {
	op, cur := newTemplateOp(id, legacy, root.Alias)
	for i, f := range graphql.CollectFields(opCtx, root.Selections, []string{"PresenceChange"}) {
		if len(f.Deferrables) > 0 {
			return nil
		}
		var k uint8
		var shape *memberShape
		switch f.Name {
		case "subject":
			k = fieldSubject
		case "count":
			k = fieldCount
		case "joins", "leaves", "updates":
			switch f.Name {
			case "joins":
				k = fieldJoins
			case "leaves":
				k = fieldLeaves
			default:
				k = fieldUpdates
			}
			if shape = newMemberShape(graphql.CollectFields(opCtx, f.Selections, []string{"Member"})); shape == nil {
				return nil
			}
		case "__typename":
			k = fieldPresenceTypename
		default:
			return nil
		}
		op.addPiece(aliasPiece(cur, i, f.Alias), k)
		op.shapes = append(op.shapes, shape)
		cur = nil
	}
	op.endTemplate(cur)
	return op
}

// presenceStreamKey carries an executor-path presence subscription's
// channel to the presence resolver.
type presenceStreamKey struct{}

// newPresenceOp builds the operation serving the presence subscription
// root of opCtx: the fast path when its selection allows (and
// !executorOnly), else the executor.
func (s *Server) newPresenceOp(ctx context.Context, id string, legacy bool, opCtx *graphql.OperationContext, root graphql.CollectedField, executorOnly bool) *gqlOp {
	if !executorOnly {
		if op := newFastPresenceOp(opCtx, id, legacy, root); op != nil {
			return op
		}
	}
	ch := make(chan *schema.PresenceChange, 1)
	h, octx := s.gqlExec.DispatchOperation(context.WithValue(ctx, presenceStreamKey{}, ch), opCtx)
	op := &gqlOp{id: id, next: h, ctx: octx, pch: ch, head: nextHead(id, legacy)}
	op.overhead = len(op.head) + 64
	return op
}

// gqlPresenceChange is a presence event as the executor's PresenceChange.
func gqlPresenceChange(ev *fanout.Event) *schema.PresenceChange {
	pc := &schema.PresenceChange{Subject: ev.Subject}
	pp := gqlPresence(ev)
	if pp == nil {
		return pc
	}
	_ = json.Unmarshal(pp.count, &pc.Count)
	lists := [3]*[]schema.Member{&pc.Joins, &pc.Leaves, &pc.Updates}
	for i, ms := range pp.lists {
		out := make([]schema.Member, len(ms))
		for j, m := range ms {
			out[j] = m.schema()
		}
		*lists[i] = out
	}
	return pc
}

// schema is m as the executor's Member.
func (m presMember) schema() schema.Member {
	var sm schema.Member
	_ = json.Unmarshal(m.conn, &sm.Conn)
	if string(m.sub) != "null" {
		var sub string
		_ = json.Unmarshal(m.sub, &sub)
		sm.Sub = &sub
	}
	if string(m.state) != "null" {
		sm.State = schema.JSON(m.state)
	}
	return sm
}

// gqlWatchPresence starts the presence subscription id (root) of a
// GraphQL connection: admitted as any subscription to its pattern, then
// a presence watch of the connection, whose changes the writer splices
// into next messages until complete (gqlComplete: endSubscription
// unwatches) or the connection's end (presence.leaveAll).
func (c *conn) gqlWatchPresence(ctx context.Context, id string, opCtx *graphql.OperationContext, root graphql.CollectedField) {
	g := c.gql
	pattern, _ := root.ArgumentMap(opCtx.Variables)["subject"].(string)
	if !c.admitSubscription(id, pattern) {
		return
	}
	if msg := presenceFiltered(c.grants, pattern); msg != "" {
		c.clientError(id, CodeForbidden, "presence: "+msg)
		return
	}
	op := c.s.newPresenceOp(ctx, id, g.legacy, opCtx, root, c.s.gqlExecutorOnly)
	g.opsMu.Lock()
	g.ops[id] = op // before the watch: its SubsList lists the operation
	g.opsMu.Unlock()
	c.subsMu.Lock()
	c.subs[id] = &subState{pattern: pattern, live: true, presence: true, watchOnly: true}
	c.subsMu.Unlock()
	c.s.pres.Watch(&c.pc, id, pattern)
	c.s.metrics.Subscriptions.Inc()
}

// The resolvers' presence side (schema.Backend).

func (b gqlBackend) Presence(ctx context.Context, subject string) (<-chan *schema.PresenceChange, error) {
	if ch, ok := ctx.Value(presenceStreamKey{}).(chan *schema.PresenceChange); ok {
		return ch, nil
	}
	return nil, errors.New("presence is a subscription: subscribe over WebSocket at /graphql (graphql-transport-ws)")
}

// Track is the track mutation: the WebSocket connection it runs on joins
// subject, as a native track (conn.trackRefused).
func (b gqlBackend) Track(ctx context.Context, subject string, state schema.JSON, resume *string) (*schema.Tracked, error) {
	op, ok := ctx.Value(gqlConnKey{}).(*gqlConnOp)
	if !ok {
		return nil, webSocketRequired("track")
	}
	var raw json.RawMessage
	if state != nil {
		raw = json.RawMessage(state)
	}
	key, secret, r := op.c.trackRefused(subject, raw, deref(resume))
	if err := op.refused(r, subject); err != nil {
		return nil, err
	}
	return &schema.Tracked{Member: key, Resume: secret}, nil
}

// Untrack is the untrack mutation (conn.untrackRefused).
func (b gqlBackend) Untrack(ctx context.Context, subject string) (bool, error) {
	op, ok := ctx.Value(gqlConnKey{}).(*gqlConnOp)
	if !ok {
		return false, webSocketRequired("untrack")
	}
	return true, op.refused(op.c.untrackRefused(subject), subject)
}

func webSocketRequired(field string) error {
	return &gqlerror.Error{
		Message:    field + " needs a GraphQL WebSocket connection (graphql-transport-ws at /graphql): the connection is the member, and leaves when it closes",
		Extensions: map[string]any{"code": CodeWebSocketRequired},
	}
}

// Members is the members query: with the connection's grants over
// WebSocket (each members field of an operation after its first counts
// against MaxMessageRate, as publish's do), with the request's over HTTP
// (Config.Authenticate with the request and no payload, as the native
// protocol's upgrade; no authentication: every subject).
func (b gqlBackend) Members(ctx context.Context, subject string, after *string, limit *int) (*schema.MemberPage, error) {
	s := b.s
	var pg memberPage
	// The native page's budget: GraphQL's members are its members' JSON
	// (its response is refused whole if it could never fit: gqlSubscribe).
	maxBytes := s.pageBytes() - membersOverhead("", subject) - 128
	switch {
	case ctx.Value(gqlConnKey{}) != nil:
		op := ctx.Value(gqlConnKey{}).(*gqlConnOp)
		if r := op.overRate(s); r != nil {
			return nil, op.refused(r, subject)
		}
		var r *presenceRefused
		if pg, r = s.membersPage(op.c.grants, subject, after, limit, maxBytes); r != nil {
			return nil, op.refused(r, subject)
		}
	case ctx.Value(gqlRequestKey{}) != nil:
		q := ctx.Value(gqlRequestKey{}).(*gqlHTTPRequest)
		grants, err := q.grants(s)
		if err != nil {
			return nil, &gqlerror.Error{Message: "unauthorized: " + err.Error(), Extensions: map[string]any{"code": CodeUnauthorized}}
		}
		var r *presenceRefused
		if pg, r = s.membersPage(grants, subject, after, limit, maxBytes); r != nil {
			return nil, r.gqlError(subject)
		}
	default:
		return nil, errors.New("members: no connection or request to list for")
	}
	page := &schema.MemberPage{Subject: subject, Count: pg.count, Members: make([]schema.Member, len(pg.members))}
	for i, m := range pg.members {
		page.Members[i] = splitMember(m).schema()
	}
	if pg.next != "" {
		next := pg.next
		page.Next = &next
	}
	return page, nil
}

// gqlError is the refusal as a field's error.
func (r *presenceRefused) gqlError(subject string) *gqlerror.Error {
	return &gqlerror.Error{Message: r.msg, Extensions: map[string]any{"code": r.code, "subject": subject}}
}
