package gateway

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
type Event struct {
	Subject   string
	Cursor    string
	buf       []byte // head followed by tail; immutable
	split     int    // len(head); -1 for a control message that is written whole
	subjStart int32  // start of the subject's JSON string in buf (GraphQL splices it)
	subjEnd   int32  // its end
	curEnd    int32  // end of the cursor's JSON string in buf; 0 without a cursor
	kind      uint8  // kindEvent; kindLeave: a view's leave (no data); kindSynced: a GraphQL synced (keys); kindPresence: presence changes
	// ingestTruncate: the subject is a truncate's (<table>.%truncate) on
	// Config.ReservedSubjects, which only the ingest (and credentials the
	// operator named them to) publishes: only there is a truncate-shaped
	// event a truncate (Server.newEvent).
	ingestTruncate bool
	// ext is what a transport attached to the event, built once for all
	// its deliveries (GraphQL: a synced's keys, a presence change's
	// values); the fan-out never reads it.
	ext any

	data       []byte                        // the data as in buf (views parse it)
	dataParsed atomic.Pointer[filter.Parsed] // the data parsed, once, by the first filter that needs it
}

// parsed is the event's data as filters see it, parsed on first use and
// shared by every filter and view that looks at the event while the
// dispatcher dispatches it (hub.dispatch drops it after the batch).
func (e *Event) parsed() *filter.Parsed {
	if p := e.dataParsed.Load(); p != nil {
		return p
	}
	p := filter.Parse(e.Subject, e.data, e.ingestTruncate)
	e.dataParsed.Store(p)
	return p
}

// leaveEvent is the leave of a view for ev's subject (fanout_view.go), at ev's
// cursor: {"type":"leave","subject":…[,"cursor":…],"subs":[…]}.
func leaveEvent(ev *Event) *Event {
	buf := make([]byte, 0, 48+len(ev.Subject)+len(ev.Cursor))
	buf = append(buf, leavePrefix...)
	buf = jsonstr.Append(buf, ev.Subject)
	subjEnd, curEnd := len(buf), 0
	if ev.Cursor != "" {
		buf = append(buf, cursorField...)
		buf = jsonstr.Append(buf, ev.Cursor)
		curEnd = len(buf)
	}
	buf = append(buf, subsField...)
	split := len(buf)
	buf = append(buf, '}')
	return &Event{Subject: ev.Subject, Cursor: ev.Cursor, buf: buf, split: split, subjStart: int32(len(leavePrefix)), subjEnd: int32(subjEnd), curEnd: int32(curEnd), kind: kindLeave}
}

// subjectJSON, cursorJSON and dataJSON are the event's values as encoded in
// buf, for transports that splice them into their own envelope (GraphQL).
func (e *Event) subjectJSON() []byte {
	return e.buf[e.subjStart:e.subjEnd]
}

// Event kinds.
const (
	kindEvent uint8 = iota
	kindLeave
	kindSynced
	kindPresence // a subject's presence changes (presence.go): data is its body from "count" on
)

// cursorJSON is nil when the event has no cursor.
func (e *Event) cursorJSON() []byte {
	if e.curEnd == 0 {
		return nil
	}
	return e.buf[int(e.subjEnd)+len(cursorField) : e.curEnd]
}

// dataJSON is null for a leave.
func (e *Event) dataJSON() []byte {
	if e.kind != kindEvent {
		return nullJSON
	}
	return e.buf[e.split+len(dataField) : len(e.buf)-1]
}

var nullJSON = []byte("null")

// subsList is what a delivery needs to know about the subscriptions of one
// connection that match a set of patterns. For the native protocol it is
// their ids as a JSON array, e.g. ["s1","s3"]; for GraphQL, the operations,
// each with its frame template. It is computed when the subscription set
// changes, never per event, and is immutable.
type subsList struct {
	b    []byte
	ext  any // a transport's list (GraphQL: the operations, []*gqlOp); the fan-out never reads it
	size int // bytes a delivery adds to the event's (mailbox accounting)
}

// item is a mailbox entry: 16 bytes, no copy of the event.
type item struct {
	ev   *Event
	subs *subsList // nil for control messages
}

func (it item) size() int {
	if it.subs == nil {
		return len(it.ev.buf)
	}
	return len(it.ev.buf) + it.subs.size
}

// appendTo splices the delivery into dst. It allocates only when dst must grow.
func (it item) appendTo(dst []byte) []byte {
	if it.subs == nil {
		return append(dst, it.ev.buf...)
	}
	dst = append(dst, it.ev.buf[:it.ev.split]...)
	dst = append(dst, it.subs.b...)
	return append(dst, it.ev.buf[it.ev.split:]...)
}

const (
	leavePrefix = `{"type":"leave","subject":`
	headPrefix  = `{"type":"event","subject":`
	cursorField = `,"cursor":`
	subsField   = `,"subs":`
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
		data = fixUTF8(data)
	}
	n := len(headPrefix) + jsonstr.Len(subject) + len(subsField) + len(dataField) + len(data) + 1
	if cursor != "" {
		n += len(cursorField) + jsonstr.Len(cursor)
	}
	buf := make([]byte, 0, n)
	buf = append(buf, headPrefix...)
	buf = jsonstr.Append(buf, subject)
	subjEnd, curEnd := len(buf), 0
	if cursor != "" {
		buf = append(buf, cursorField...)
		buf = jsonstr.Append(buf, cursor)
		curEnd = len(buf)
	}
	buf = append(buf, subsField...)
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

// controlMessage wraps a complete server message (already JSON) so it can
// travel through the mailbox in order with events.
func controlMessage(b []byte) *Event {
	return &Event{buf: b, split: -1}
}

func encodeSubsList(ids []string) *subsList {
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
	return &subsList{b: b, size: len(b)}
}

// fixUTF8 returns data with each invalid UTF-8 sequence replaced by the
// JSON escape \ufffd. In valid JSON, invalid bytes can only be inside
// strings (everything else is ASCII), where the escape is valid.
func fixUTF8(data []byte) []byte {
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
