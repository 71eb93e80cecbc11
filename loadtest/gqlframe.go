package loadtest

import (
	"bytes"
	"math"
)

// With Config.Proto "graphql" every event is one WebSocket message of the
// graphql-transport-ws protocol:
//
//	{"id":"s1","type":"next","payload":{"data":{"events":{"subject":"loadtest.x.hot","cursor":"js:5","data":{"seq":12,"ts":1764500000000000000,"pad":"xx"}}}}}
//
// (the event fields in the order of the query's selection; cursor is null
// on Core NATS). As for the native protocol (frame.go), only what the
// verifier needs is looked for, without a generic JSON decode: the layout
// the gateway writes is matched by prefix, then the members of the events
// object are walked to its "data", whose seq and ts eventFast parses.
// Anything else (another member order, whitespace, other messages) takes a
// slower path that walks the JSON objects properly, so a "data" key or a
// '}' inside a string is never taken for structure. Neither allocates.

// gqlNextPrefix is a next message of our subscription up to the events
// object, as the gateway writes it.
var gqlNextPrefix = []byte(`{"id":"` + subID + `","type":"next","payload":{"data":{"events":`)

// parseNext classifies one graphql-transport-ws message and, for an event,
// returns data.seq and data.ts. A next message without data (a GraphQL
// execution error), an error and a complete (the server ended the
// subscription) are kindError; connection_ack, ping and pong are kindOther.
func parseNext(msg []byte) (kind msgKind, seq uint64, ts int64) {
	ev, ok := bytes.CutPrefix(msg, gqlNextPrefix)
	if !ok {
		if kind, ev = classifyGQL(msg); kind != kindEvent {
			return kind, 0, 0
		}
	}
	data, ok := member(ev, "data")
	if !ok {
		return kindMalformed, 0, 0
	}
	if seq, ts, ok := eventFast(data); ok {
		return kindEvent, seq, ts
	}
	s, okSeq := uintMember(data, "seq")
	t, okTS := uintMember(data, "ts")
	if !okSeq || !okTS || t > math.MaxInt64 {
		return kindMalformed, 0, 0
	}
	return kindEvent, s, int64(t)
}

// nextCursor returns the cursor of a next message's event, "" when it is
// null (Core NATS) or absent. It allocates the string: it runs once per
// planned drop, not per event.
func nextCursor(msg []byte) string {
	ev, ok := bytes.CutPrefix(msg, gqlNextPrefix)
	if !ok {
		var kind msgKind
		if kind, ev = classifyGQL(msg); kind != kindEvent {
			return ""
		}
	}
	v, ok := member(ev, "cursor")
	if !ok {
		return ""
	}
	s, ok := stringContent(v)
	if !ok {
		return ""
	}
	return string(s) // cursors (js:<seq>, rs:<ms>-<seq>) contain no escapes
}

// classifyGQL finds a message's type the slow way and, for a next message,
// its payload.data.events object (and what follows it).
func classifyGQL(msg []byte) (kind msgKind, events []byte) {
	v, ok := member(msg, "type")
	if !ok {
		return kindMalformed, nil
	}
	typ, ok := stringContent(v)
	if !ok {
		return kindMalformed, nil
	}
	switch string(typ) {
	case "next":
	case "error", "complete":
		return kindError, nil
	default:
		return kindOther, nil
	}
	payload, ok := member(msg, "payload")
	if !ok {
		return kindMalformed, nil
	}
	data, ok := member(payload, "data")
	if !ok || bytes.HasPrefix(data, []byte("null")) {
		if _, ok := member(payload, "errors"); ok {
			return kindError, nil
		}
		return kindMalformed, nil
	}
	if events, ok = member(data, "events"); !ok || len(events) == 0 || events[0] != '{' {
		return kindMalformed, nil
	}
	return kindEvent, events
}

// member returns the value of the member key of the JSON object at the
// start of obj (and whatever follows that value); ok is false when obj
// does not start with an object or has no such member. Keys are compared
// as written (a key spelled with escapes does not match). Members before
// key are skipped as JSON values, so keys and braces inside strings or
// nested values are never mistaken for obj's own.
func member(obj []byte, key string) (val []byte, ok bool) {
	b := skipSpace(obj)
	if len(b) == 0 || b[0] != '{' {
		return nil, false
	}
	b = skipSpace(b[1:])
	if len(b) > 0 && b[0] == '}' {
		return nil, false
	}
	for {
		if len(b) == 0 || b[0] != '"' {
			return nil, false
		}
		rest, ok := skipString(b)
		if !ok {
			return nil, false
		}
		k := b[1 : len(b)-len(rest)-1]
		b = skipSpace(rest)
		if len(b) == 0 || b[0] != ':' {
			return nil, false
		}
		b = skipSpace(b[1:])
		if string(k) == key {
			return b, true
		}
		if b, ok = skipValue(b); !ok {
			return nil, false
		}
		b = skipSpace(b)
		if len(b) == 0 || b[0] != ',' {
			return nil, false // '}': no such member, or not JSON
		}
		b = skipSpace(b[1:])
	}
}

// uintMember parses member key of the object at the start of obj as an
// unsigned decimal integer.
func uintMember(obj []byte, key string) (uint64, bool) {
	v, ok := member(obj, key)
	if !ok {
		return 0, false
	}
	n, rest, ok := parseUint(v)
	if !ok {
		return 0, false
	}
	if rest = skipSpace(rest); len(rest) == 0 || (rest[0] != ',' && rest[0] != '}') {
		return 0, false // 1.5, 1e3, ...
	}
	return n, true
}

// stringContent returns what is between the quotes of the JSON string at
// the start of b, escapes left as they are.
func stringContent(b []byte) ([]byte, bool) {
	if len(b) == 0 || b[0] != '"' {
		return nil, false
	}
	rest, ok := skipString(b)
	if !ok {
		return nil, false
	}
	return b[1 : len(b)-len(rest)-1], true
}

// skipString skips the JSON string at the start of b (b[0] is its opening
// quote) and returns what follows it.
func skipString(b []byte) ([]byte, bool) {
	for i := 1; ; {
		j := bytes.IndexByte(b[i:], '"')
		if j < 0 {
			return nil, false
		}
		i += j
		// The quote ends the string unless an odd number of backslashes
		// escapes it.
		n := 0
		for k := i - 1; k > 0 && b[k] == '\\'; k-- {
			n++
		}
		if n%2 == 0 {
			return b[i+1:], true
		}
		i++
	}
}

// skipValue skips the JSON value at the start of b and returns what
// follows it. Scalars other than strings are skipped to the next
// delimiter, not checked.
func skipValue(b []byte) ([]byte, bool) {
	if len(b) == 0 {
		return nil, false
	}
	switch b[0] {
	case '"':
		return skipString(b)
	case '{', '[':
		depth := 0
		for i := 0; i < len(b); {
			switch b[i] {
			case '"':
				rest, ok := skipString(b[i:])
				if !ok {
					return nil, false
				}
				i = len(b) - len(rest)
				continue
			case '{', '[':
				depth++
			case '}', ']':
				if depth--; depth == 0 {
					return b[i+1:], true
				}
			}
			i++
		}
		return nil, false
	default:
		i := 0
		for i < len(b) && b[i] != ',' && b[i] != '}' && b[i] != ']' && b[i] != ' ' && b[i] != '\t' && b[i] != '\r' && b[i] != '\n' {
			i++
		}
		return b[i:], i > 0
	}
}
