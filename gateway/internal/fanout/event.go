package fanout

import (
	"bytes"
	"encoding/json"
	"fmt"
	"sync/atomic"
	"unicode/utf8"

	"github.com/fanwire/fanwire/gateway/internal/filter"
	"github.com/fanwire/fanwire/jsonstr"
)

// Event is one broker message prepared for fan-out. It is encoded once, when
// it arrives, and then shared read-only by every delivery: a delivery splices
// the connection's encoded subscription list between head and tail, so the
// data is never copied into an intermediate value or re-serialized.
//
//	head: {"type":"event","subject":"orders.42"[,"cursor":"js:7"],"subs":
//	tail: ,"data":<data>}
//
// Its exported fields are set before it is shared, never after.
type Event struct {
	Subject string
	Cursor  string
	// IngestTruncate: the subject is a truncate's (<table>.%truncate) on
	// the gateway's reserved subjects, which only the ingest (and
	// credentials the operator named them to) publishes: only there is a
	// truncate-shaped event a truncate.
	IngestTruncate bool
	// Ext is what a transport attached to the event, built once for all
	// its deliveries (GraphQL: a synced's keys, a presence change's
	// values); the fan-out never reads it.
	Ext any

	buf        []byte                        // head followed by tail; immutable
	split      int                           // len(head); -1 for a message that is written whole
	subjStart  int32                         // start of the subject's JSON string in buf
	subjEnd    int32                         // its end
	curEnd     int32                         // end of the cursor's JSON string in buf; 0 without a cursor
	kind       Kind                          // what the event is (Kind)
	data       []byte                        // the data as in buf (views parse it)
	dataParsed atomic.Pointer[filter.Parsed] // the data parsed, once, by the first filter that needs it
}

// Kind is what an Event is.
type Kind uint8

const (
	KindEvent    Kind = iota // a broker message
	KindLeave                // a view's leave (no data; NewLeave)
	KindSynced               // a view's synced for a transport that delivers it as an event (NewSynced)
	KindPresence             // a subject's presence changes (NewFields): the data is its fields
)

// Kind reports what e is.
func (e *Event) Kind() Kind { return e.kind }

// Bytes is the whole encoded message, head and tail: what a delivery
// without a subscription list writes (a control message's, a synced's
// subject and cursor).
func (e *Event) Bytes() []byte { return e.buf }

// Split is the head's length, where a delivery splices its subscription
// list: -1 for a message written whole (NewControl, NewSynced).
func (e *Event) Split() int { return e.split }

// Data is the event's data as encoded (for a KindPresence event, its
// fields).
func (e *Event) Data() []byte { return e.data }

// Parsed is the event's data as filters see it, parsed on first use and
// shared by every filter and view that looks at the event until
// DropParsed.
func (e *Event) Parsed() *filter.Parsed {
	if p := e.dataParsed.Load(); p != nil {
		return p
	}
	p := filter.Parse(e.Subject, e.data, e.IngestTruncate)
	e.dataParsed.Store(p)
	return p
}

// ParsedNoKeep is Parsed without keeping a parse it makes: for a reader
// outside the dispatch (a replay's, a feed's, a hand-over's), which must
// not leave a parse on an event that caches and mailboxes keep (every
// parsed tree kept would hold a few times each cached event's size).
func (e *Event) ParsedNoKeep() *filter.Parsed {
	if p := e.dataParsed.Load(); p != nil {
		return p
	}
	return filter.Parse(e.Subject, e.data, e.IngestTruncate)
}

// DropParsed drops the parse Parsed kept: the event lives on in mailboxes
// and the recent ring, where it would only take room (a few times the
// data's size).
func (e *Event) DropParsed() { e.dataParsed.Store(nil) }

// NewLeave is the leave of a view for ev's subject, at ev's cursor:
// {"type":"leave","subject":…[,"cursor":…],"subs":[…]}.
func NewLeave(ev *Event) *Event {
	buf := make([]byte, 0, 48+len(ev.Subject)+len(ev.Cursor))
	buf = append(buf, leavePrefix...)
	buf, subjEnd, curEnd := appendSubjectCursor(buf, ev.Subject, ev.Cursor)
	buf = append(buf, SubsField...)
	split := len(buf)
	buf = append(buf, '}')
	return &Event{Subject: ev.Subject, Cursor: ev.Cursor, buf: buf, split: split, subjStart: int32(len(leavePrefix)), subjEnd: int32(subjEnd), curEnd: int32(curEnd), kind: KindLeave}
}

// NewSynced is a view's synced for a transport that delivers it through
// a subscription as an event (GraphQL): subject is the view's pattern,
// cursor where the view is complete, ext the transport's. Its Bytes are
// the subject's JSON string and the cursor's field; it is written by the
// transport's own template, never whole.
func NewSynced(subject, cursor string, ext any) *Event {
	buf, subjEnd, curEnd := appendSubjectCursor(nil, subject, cursor)
	return &Event{Subject: subject, Cursor: cursor, buf: buf, split: -1, subjEnd: int32(subjEnd), curEnd: int32(curEnd), kind: KindSynced, Ext: ext}
}

// NewFields is an event of kind whose head is prefix (`{"type":"…","subject":`),
// subject and the subscription list's field, and whose tail is the fields
// that fields appends (without a leading comma), closed by '}'; its Data
// is those fields. n is a hint of the size.
func NewFields(kind Kind, prefix, subject string, n int, fields func(buf []byte) []byte) *Event {
	buf := make([]byte, 0, len(prefix)+jsonstr.Len(subject)+len(SubsField)+2+n)
	buf = append(buf, prefix...)
	buf = jsonstr.Append(buf, subject)
	subjEnd := len(buf)
	buf = append(buf, SubsField...)
	split := len(buf)
	buf = append(buf, ',')
	dataStart := len(buf)
	buf = fields(buf)
	buf = append(buf, '}')
	return &Event{Subject: subject, buf: buf, split: split, subjStart: int32(len(prefix)), subjEnd: int32(subjEnd), kind: kind, data: buf[dataStart : len(buf)-1 : len(buf)-1]}
}

// SubjectJSON, CursorJSON and DataJSON are the event's values as encoded,
// for transports that splice them into their own envelope (GraphQL).
func (e *Event) SubjectJSON() []byte {
	return e.buf[e.subjStart:e.subjEnd]
}

// CursorJSON is nil when the event has no cursor.
func (e *Event) CursorJSON() []byte {
	if e.curEnd == 0 {
		return nil
	}
	return e.buf[int(e.subjEnd)+len(cursorField) : e.curEnd]
}

// DataJSON is null for a leave, a synced and presence changes.
func (e *Event) DataJSON() []byte {
	if e.kind != KindEvent {
		return NullJSON
	}
	return e.buf[e.split+len(dataField) : len(e.buf)-1]
}

// NullJSON is JSON's null.
var NullJSON = []byte("null")

// SubsList is what a delivery needs to know about the subscriptions of one
// connection that match a set of patterns. For the native protocol it is
// their ids as a JSON array, e.g. ["s1","s3"]; for GraphQL, the operations,
// each with its frame template. It is computed when the subscription set
// changes, never per event, and is immutable.
type SubsList struct {
	B    []byte // the list as the native protocol's subs field writes it
	Ext  any    // a transport's list (GraphQL: the operations); the fan-out never reads it
	Size int    // bytes a delivery adds to the event's (mailbox accounting)
}

// Item is a mailbox entry, one delivery: 16 bytes, no copy of the event.
type Item struct {
	Ev   *Event
	Subs *SubsList // nil for control messages
}

// Size is the delivery's size in bytes, as the mailbox counts it.
func (it Item) Size() int {
	if it.Subs == nil {
		return len(it.Ev.buf)
	}
	return len(it.Ev.buf) + it.Subs.Size
}

// WireLen is the number of bytes AppendTo appends (the native protocol's
// delivery; Size counts a transport's list as its SubsList says).
func (it Item) WireLen() int {
	if it.Subs == nil {
		return len(it.Ev.buf)
	}
	return len(it.Ev.buf) + len(it.Subs.B)
}

// AppendTo splices the delivery into dst. It allocates only when dst must grow.
func (it Item) AppendTo(dst []byte) []byte {
	if it.Subs == nil {
		return append(dst, it.Ev.buf...)
	}
	dst = append(dst, it.Ev.buf[:it.Ev.split]...)
	dst = append(dst, it.Subs.B...)
	return append(dst, it.Ev.buf[it.Ev.split:]...)
}

// The native protocol's envelope pieces. SubsField is also every
// NewFields event's, which its callers size.
const (
	leavePrefix = `{"type":"leave","subject":`
	headPrefix  = `{"type":"event","subject":`
	cursorField = `,"cursor":`
	SubsField   = `,"subs":`
	dataField   = `,"data":`
)

// NewEvent validates data as JSON and builds the shared event in one
// allocation. Data that contains whitespace outside strings is compacted so
// that no raw newline reaches the wire (the framing uses '\n'). Data that is
// not JSON is rejected: forwarding it would corrupt every client's stream.
func NewEvent(subject, cursor string, data []byte) (*Event, error) {
	if !json.Valid(data) {
		return nil, fmt.Errorf("event on %q: data is not valid JSON", subject)
	}
	if !utf8.Valid(data) {
		// encoding/json accepts invalid UTF-8 inside strings, but a
		// WebSocket text frame must be UTF-8: browsers fail the whole
		// connection on one bad byte. Replace each invalid sequence with
		// U+FFFD, as encoding/json does when it encodes.
		data = FixUTF8(data)
	}
	buf := make([]byte, 0, EventSize(subject, cursor, len(data)))
	buf = append(buf, headPrefix...)
	buf, subjEnd, curEnd := appendSubjectCursor(buf, subject, cursor)
	buf = append(buf, SubsField...)
	split := len(buf)
	buf = append(buf, dataField...)
	dataStart := len(buf)
	if bytes.IndexAny(data, " \t\r\n") < 0 {
		buf = append(buf, data...)
	} else {
		w := bytes.NewBuffer(buf)
		if err := json.Compact(w, data); err != nil {
			return nil, fmt.Errorf("event on %q: compact data: %w", subject, err)
		}
		buf = w.Bytes()
	}
	buf = append(buf, '}')
	return &Event{Subject: subject, Cursor: cursor, buf: buf, split: split, subjStart: int32(len(headPrefix)), subjEnd: int32(subjEnd), curEnd: int32(curEnd), data: buf[dataStart : len(buf)-1 : len(buf)-1]}, nil
}

// EventSize is the size of the event NewEvent builds from subject, cursor
// and compacted data of n bytes: what a delivery of it takes in a
// mailbox, besides the subscription list it carries.
func EventSize(subject, cursor string, n int) int {
	size := len(headPrefix) + jsonstr.Len(subject) + len(SubsField) + len(dataField) + n + 1
	if cursor != "" {
		size += len(cursorField) + jsonstr.Len(cursor)
	}
	return size
}

// appendSubjectCursor appends subject's JSON string and, when cursor is
// not empty, the cursor's field, and says where each ends in buf (curEnd
// 0: no cursor).
func appendSubjectCursor(buf []byte, subject, cursor string) (_ []byte, subjEnd, curEnd int) {
	buf = jsonstr.Append(buf, subject)
	subjEnd = len(buf)
	if cursor != "" {
		buf = append(buf, cursorField...)
		buf = jsonstr.Append(buf, cursor)
		curEnd = len(buf)
	}
	return buf, subjEnd, curEnd
}

// NewControl wraps a complete server message (already JSON) so it can
// travel through the mailbox in order with events.
func NewControl(b []byte) *Event {
	return &Event{buf: b, split: -1}
}

// EncodeSubsList is the native protocol's list of the subscriptions ids.
func EncodeSubsList(ids []string) *SubsList {
	n := 2 + max(len(ids)-1, 0) // brackets and commas
	for _, id := range ids {
		n += jsonstr.Len(id)
	}
	b := make([]byte, 0, n)
	b = append(b, '[')
	for i, id := range ids {
		if i > 0 {
			b = append(b, ',')
		}
		b = jsonstr.Append(b, id)
	}
	b = append(b, ']')
	return &SubsList{B: b, Size: len(b)}
}

// FixUTF8 returns data with each invalid UTF-8 sequence replaced by the
// JSON escape \ufffd. In valid JSON, invalid bytes can only be inside
// strings (everything else is ASCII), where the escape is valid.
func FixUTF8(data []byte) []byte {
	out := make([]byte, 0, len(data)+16)
	for i := 0; i < len(data); {
		r, size := utf8.DecodeRune(data[i:])
		if r == utf8.RuneError && size <= 1 {
			out = append(out, `\ufffd`...)
			i++
			continue
		}
		out = append(out, data[i:i+size]...)
		i += size
	}
	return out
}
