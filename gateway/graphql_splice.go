package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"sync/atomic"

	"github.com/99designs/gqlgen/graphql"
	"github.com/fanwire/fanwire/gateway/internal/fanout"
	"github.com/fanwire/fanwire/jsonstr"
	"github.com/fanwire/fanwire/schema"
)

// GraphQL splice templates: an events subscription whose selection is made
// of Event's own fields is served by splicing each event's shared bytes into
// a next-message template computed when it subscribed (gqlOp); any other
// selection runs through gqlgen's executor per event.

// gqlField kinds: which of an event's values a selected field takes.
const (
	fieldSubject = iota
	fieldCursor
	fieldData
	fieldTypename
	fieldKind
	fieldKeys
	// A presence subscription's PresenceChange (graphql_presence.go).
	fieldCount
	fieldJoins // fieldJoins+i: the i-th of presParts.lists
	fieldLeaves
	fieldUpdates
	fieldPresenceTypename
)

// What GraphQL attaches to the fan-out's values: an Event's Ext (a
// synced's keys, a presence change's values) and a SubsList's (the
// operations a delivery goes to).

// gqlSynced is a GraphQL synced event's ext: the filtered view's keys
// (nil: none listed), and their JSON as the keys field writes it.
type gqlSynced struct {
	keys []string
	json []byte
}

// gqlSyncedEvent is a GraphQL synced, delivered through a subscription's
// operation as an Event of kind SYNCED: subject is the pattern, cursor
// where the view is complete.
func gqlSyncedEvent(pattern, cursor string, keys []string) *fanout.Event {
	sy := &gqlSynced{keys: keys, json: fanout.NullJSON}
	if keys != nil {
		sy.json = []byte{'['}
		for i, k := range keys {
			if i > 0 {
				sy.json = append(sy.json, ',')
			}
			sy.json = jsonstr.Append(sy.json, k)
		}
		sy.json = append(sy.json, ']')
	}
	return fanout.NewSynced(pattern, cursor, sy)
}

// gqlKindJSON is the GraphQL EventKind of ev.
func gqlKindJSON(ev *fanout.Event) string {
	switch ev.Kind() {
	case fanout.KindLeave:
		return `"LEAVE"`
	case fanout.KindSynced:
		return `"SYNCED"`
	}
	return `"EVENT"`
}

// gqlKeysJSON is the GraphQL keys of ev: null, or a synced's list.
func gqlKeysJSON(ev *fanout.Event) []byte {
	if sy, ok := ev.Ext.(*gqlSynced); ok {
		return sy.json
	}
	return fanout.NullJSON
}

// gqlPresence is a presence event's GraphQL values (nil: none attached).
func gqlPresence(ev *fanout.Event) *presParts {
	p, _ := ev.Ext.(*presParts)
	return p
}

// gqlOps is the operations a GraphQL delivery goes to.
func gqlOps(l *fanout.SubsList) []*gqlOp {
	ops, _ := l.Ext.([]*gqlOp)
	return ops
}

// gqlOp is one GraphQL subscription of a connection. It is immutable after
// it is registered, but for done.
type gqlOp struct {
	id string
	// Fast path: pieces[0], value kinds[0], pieces[1], ..., pieces[len(kinds)].
	pieces [][]byte
	kinds  []uint8
	shapes []*memberShape // a presence op's: parallel to kinds, the member lists' selections (nil for other fields)
	// Executor path (fast == false): the executor's response stream, fed one
	// event at a time through ch by the writer.
	fast bool
	next graphql.ResponseHandler
	ctx  context.Context
	ch   chan *schema.Event          // events
	pch  chan *schema.PresenceChange // presence
	head []byte                      // {"id":...,"type":"next","payload":

	overhead int // bytes a delivery adds to the event's (mailbox accounting); fast path: the pieces' total length
	done     atomic.Bool
	// markers: the selection has kind, so the client tells EVENT from
	// SYNCED; only such an operation is sent SYNCED (LEAVE comes only with
	// where, which no client predating it sends).
	markers bool
}

// appendNext appends the operation's next message for ev.
func (op *gqlOp) appendNext(dst []byte, ev *fanout.Event) []byte {
	if !op.fast {
		return op.appendExecuted(dst, ev)
	}
	for i, k := range op.kinds {
		dst = append(dst, op.pieces[i]...)
		switch k {
		case fieldSubject:
			dst = append(dst, ev.SubjectJSON()...)
		case fieldCursor:
			if c := ev.CursorJSON(); c != nil {
				dst = append(dst, c...)
			} else {
				dst = append(dst, "null"...)
			}
		case fieldData:
			dst = append(dst, ev.DataJSON()...)
		case fieldTypename:
			dst = append(dst, `"Event"`...)
		case fieldKind:
			dst = append(dst, gqlKindJSON(ev)...)
		case fieldKeys:
			dst = append(dst, gqlKeysJSON(ev)...)
		case fieldCount:
			dst = append(dst, gqlPresence(ev).count...)
		case fieldJoins, fieldLeaves, fieldUpdates:
			dst = op.shapes[i].appendList(dst, gqlPresence(ev).lists[k-fieldJoins])
		case fieldPresenceTypename:
			dst = append(dst, `"PresenceChange"`...)
		}
	}
	return append(dst, op.pieces[len(op.kinds)]...)
}

// nextLen is len(op.appendNext(nil, ev)) on the fast path, so the message
// can be framed before it is built.
func (op *gqlOp) nextLen(ev *fanout.Event) int {
	n := op.overhead
	for i, k := range op.kinds {
		switch k {
		case fieldSubject:
			n += len(ev.SubjectJSON())
		case fieldCursor:
			if c := ev.CursorJSON(); c == nil {
				n += len("null")
			} else {
				n += len(c)
			}
		case fieldData:
			n += len(ev.DataJSON())
		case fieldTypename:
			n += len(`"Event"`)
		case fieldKind:
			n += len(gqlKindJSON(ev))
		case fieldKeys:
			n += len(gqlKeysJSON(ev))
		case fieldCount:
			n += len(gqlPresence(ev).count)
		case fieldJoins, fieldLeaves, fieldUpdates:
			n += op.shapes[i].listLen(gqlPresence(ev).lists[k-fieldJoins])
		case fieldPresenceTypename:
			n += len(`"PresenceChange"`)
		}
	}
	return n
}

// appendExecuted runs the executor for ev (on the writer's goroutine: the
// channel has room for the one event the response handler takes). A
// response may come without taking the event (gqlgen's one-shot error
// response does), so what is left is taken back after every response: the
// channel is empty again for the next delivery, whose send never blocks.
func (op *gqlOp) appendExecuted(dst []byte, ev *fanout.Event) []byte {
	var resp *graphql.Response
	if op.pch != nil {
		resp = offerExecuted(op, op.pch, gqlPresenceChange(ev))
	} else {
		resp = offerExecuted(op, op.ch, gqlEvent(ev))
	}
	if resp == nil { // the operation is over
		return dst
	}
	dst = append(dst, op.head...)
	dst = appendResponse(dst, resp)
	return append(dst, '}')
}

// offerExecuted hands v to the operation's response stream through ch
// (empty: the writer is its only sender) and returns the response it
// gives, nil when it is over; ch is empty again after it.
func offerExecuted[T any](op *gqlOp, ch chan T, v T) *graphql.Response {
	select {
	case ch <- v:
	default: // not reached: the writer is the only sender and empties it
		return nil
	}
	resp := op.next(op.ctx)
	select {
	case <-ch: // not taken
	default:
	}
	return resp
}

// gqlEvent is ev as the executor's Event.
func gqlEvent(ev *fanout.Event) *schema.Event {
	e := &schema.Event{Kind: schema.EventKindEvent, Subject: ev.Subject}
	switch ev.Kind() {
	case fanout.KindLeave:
		e.Kind = schema.EventKindLeave
	case fanout.KindSynced:
		e.Kind = schema.EventKindSynced
		if sy, ok := ev.Ext.(*gqlSynced); ok {
			e.Keys = sy.keys
		}
	default:
		e.Data = schema.JSON(ev.DataJSON())
	}
	if ev.Cursor != "" {
		c := ev.Cursor
		e.Cursor = &c
	}
	return e
}

// appendResponse appends a GraphQL response as JSON, with no HTML escaping
// (as the fast path writes it).
func appendResponse(dst []byte, resp *graphql.Response) []byte {
	if len(resp.Errors) == 0 && resp.Extensions == nil && resp.Label == "" && resp.Path == nil && resp.HasNext == nil {
		dst = append(dst, `{"data":`...)
		if len(resp.Data) == 0 {
			dst = append(dst, "null"...)
		} else {
			dst = append(dst, resp.Data...)
		}
		return append(dst, '}')
	}
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(resp); err != nil {
		return append(dst, `{"errors":[{"message":"response could not be encoded"}]}`...)
	}
	return append(dst, bytes.TrimRight(b.Bytes(), "\n")...)
}

// newFastOp builds the next-frame template of an events subscription whose
// selection (as gqlgen collects it: fragments merged, @skip/@include
// applied, in the executor's order) is made of Event's own fields. It
// returns nil when the selection needs the executor.
func newFastOp(id string, legacy bool, rootAlias string, fields []graphql.CollectedField) *gqlOp {
	op, cur := newTemplateOp(id, legacy, rootAlias)
	for i, f := range fields {
		if len(f.Deferrables) > 0 || len(f.Selections) > 0 {
			return nil
		}
		var k uint8
		switch f.Name {
		case "subject":
			k = fieldSubject
		case "cursor":
			k = fieldCursor
		case "data":
			k = fieldData
		case "__typename":
			k = fieldTypename
		case "kind":
			k = fieldKind
			op.markers = true
		case "keys":
			k = fieldKeys
		default:
			return nil
		}
		op.addPiece(aliasPiece(cur, i, f.Alias), k)
		cur = nil
	}
	op.endTemplate(cur)
	return op
}

// newTemplateOp starts the next-message template of a subscription
// served by splicing: the frame's head up to its root field's object.
// The caller adds a piece per selected field (addPiece), then ends it
// (endTemplate).
func newTemplateOp(id string, legacy bool, rootAlias string) (*gqlOp, []byte) {
	cur := append(nextHead(id, legacy), `{"data":{`...)
	cur = jsonstr.Append(cur, rootAlias)
	return &gqlOp{id: id, fast: true}, append(cur, ":{"...)
}

// addPiece adds the template piece before a field's value, and the
// field's kind.
func (op *gqlOp) addPiece(piece []byte, k uint8) {
	op.pieces = append(op.pieces, piece)
	op.kinds = append(op.kinds, k)
	op.overhead += len(piece)
}

// endTemplate adds the last piece: cur (what is left of the template
// after the last value, if anything) and the closing braces.
func (op *gqlOp) endTemplate(cur []byte) {
	cur = append(cur, "}}}}"...)
	op.pieces = append(op.pieces, cur)
	op.overhead += len(cur)
}

// aliasPiece appends to a template piece what precedes the i-th selected
// field's value: a comma after the first, then its alias as a key.
func aliasPiece(cur []byte, i int, alias string) []byte {
	if i > 0 {
		cur = append(cur, ',')
	}
	cur = jsonstr.Append(cur, alias)
	return append(cur, ':')
}

// newGQLOp builds the operation serving the events subscription root of
// opCtx: the fast path when its selection allows (and !executorOnly), else
// the executor.
func (s *Server) newGQLOp(ctx context.Context, id string, legacy bool, opCtx *graphql.OperationContext, root graphql.CollectedField, executorOnly bool) *gqlOp {
	if !executorOnly {
		if op := newFastOp(id, legacy, root.Alias, graphql.CollectFields(opCtx, root.Selections, []string{"Event"})); op != nil {
			return op
		}
	}
	ch := make(chan *schema.Event, 1)
	h, octx := s.gqlExec.DispatchOperation(withEventStream(ctx, ch), opCtx)
	op := &gqlOp{id: id, next: h, ctx: octx, ch: ch, head: nextHead(id, legacy)}
	for _, f := range graphql.CollectFields(opCtx, root.Selections, []string{"Event"}) {
		if f.Name == "kind" {
			op.markers = true
		}
	}
	op.overhead = len(op.head) + 64
	return op
}

// nextHead is a next (legacy: data) message up to its payload.
func nextHead(id string, legacy bool) []byte {
	b := append([]byte(`{"id":`), jsonstr.Append(nil, id)...)
	if legacy {
		return append(b, `,"type":"data","payload":`...)
	}
	return append(b, `,"type":"next","payload":`...)
}
