package loadtest

import (
	"bytes"
	"math"
)

// The gateway's native protocol sends JSON objects, several per text frame
// separated by '\n'. Events look like
//
//	{"type":"event","subject":"loadtest.x.hot","cursor":"js:5","subs":["s1"],"data":{"seq":12,"ts":1764500000000000000,"pad":"xx"}}
//
// The parser below finds only what the verifier needs (type, data.seq,
// data.ts) with bytes.Index and hand-written integer parsing: decoding every
// event with encoding/json would cost the client more CPU than the gateway
// spends delivering it, and the two share the machine.

// msgKind classifies one message of a frame.
type msgKind uint8

const (
	kindOther     msgKind = iota // a message we ignore (pong, subscribed, blank line, ...)
	kindEvent                    // an event with data.seq and data.ts
	kindError                    // {"type":"error",...}
	kindMalformed                // no "type", or an event without a parseable seq or ts
	kindPublished                // {"type":"published",...}: the gateway took a client's publish
	kindLeave                    // {"type":"leave",...}: a document left a view
	kindSynced                   // {"type":"synced",...}: a subscription with "from" has caught up
)

var (
	keyType  = []byte(`"type":`)
	keyData  = []byte(`"data":`)
	keySeq   = []byte(`"seq":`)
	keyTS    = []byte(`"ts":`)
	keyCur   = []byte(`"cursor":`)
	valEvent = []byte(`"event"`)
	valError = []byte(`"error"`)
	valPub   = []byte(`"published"`)
	valLeave = []byte(`"leave"`)
	valSync  = []byte(`"synced"`)

	prefixEvent = []byte(`{"type":"event"`)
	prefixSeq   = []byte(`{"seq":`)
	prefixTS    = []byte(`,"ts":`)
)

// nextMessage splits the first message off a frame.
func nextMessage(frame []byte) (msg, rest []byte) {
	if i := bytes.IndexByte(frame, '\n'); i >= 0 {
		return frame[:i], frame[i+1:]
	}
	return frame, nil
}

// parseMessage classifies msg and, for an event, returns data.seq and data.ts.
// It allocates nothing. Keys are searched for, not decoded, so extra envelope
// fields (cursor, subs, ...), whitespace and any key order are tolerated; it
// relies on the envelope's "type" coming before any nested "type" key, which
// holds for the gateway's encoder and for our own payloads (seq, ts, pad).
//
// The layout we publish ({"type":"event",...,"data":{"seq":N,"ts":T,...) is
// matched by prefix first, and only "data" is searched for. On the 2-vCPU
// dev machine (BenchmarkParseFrame, 64 events of 256 B per frame) searching
// for every key cost 135 ns/event; the prefix fast path took it to 84,
// indexKey to 70 and keeping the overflow check off the digit loop to 59.
func parseMessage(msg []byte) (kind msgKind, seq uint64, ts int64) {
	if !bytes.HasPrefix(msg, prefixEvent) {
		if kind = classify(msg); kind != kindEvent {
			return kind, 0, 0
		}
	}
	d := indexKey(msg, keyData)
	if d < 0 {
		return kindMalformed, 0, 0
	}
	data := msg[d+len(keyData):]
	if seq, ts, ok := eventFast(data); ok {
		return kindEvent, seq, ts
	}
	seq, okSeq := uintAfter(data, keySeq)
	t, okTS := uintAfter(data, keyTS)
	if !okSeq || !okTS || t > math.MaxInt64 {
		return kindMalformed, 0, 0
	}
	return kindEvent, seq, int64(t)
}

// eventCursor returns the envelope's cursor of an event message, "" when it
// has none (Core NATS). It allocates the string: it runs once per planned
// drop, not per event.
func eventCursor(msg []byte) string { return string(eventCursorBytes(msg)) }

// eventCursorBytes is eventCursor without the copy: the cursor's bytes
// within msg, nil when there is none. Only the envelope before "data" is
// searched, so a "cursor" key inside the event's data is never taken for
// it.
func eventCursorBytes(msg []byte) []byte {
	if d := indexKey(msg, keyData); d >= 0 {
		msg = msg[:d]
	}
	i := indexKey(msg, keyCur)
	if i < 0 {
		return nil
	}
	v, ok := bytes.CutPrefix(skipSpace(msg[i+len(keyCur):]), []byte{'"'})
	if !ok {
		return nil
	}
	// Cursors (js:<seq>, rs:<ms>-<seq>) contain no escapes.
	end := bytes.IndexByte(v, '"')
	if end < 0 {
		return nil
	}
	return v[:end]
}

// classify finds the message type the slow way.
func classify(msg []byte) msgKind {
	if len(skipSpace(msg)) == 0 {
		return kindOther
	}
	i := bytes.Index(msg, keyType)
	if i < 0 {
		return kindMalformed
	}
	v := skipSpace(msg[i+len(keyType):])
	switch {
	case bytes.HasPrefix(v, valEvent):
		return kindEvent
	case bytes.HasPrefix(v, valError):
		return kindError
	case bytes.HasPrefix(v, valPub):
		return kindPublished
	case bytes.HasPrefix(v, valLeave):
		return kindLeave
	case bytes.HasPrefix(v, valSync):
		return kindSynced
	default:
		return kindOther
	}
}

// eventFast parses data that starts exactly as appendPayload writes it.
func eventFast(data []byte) (seq uint64, ts int64, ok bool) {
	rest, ok := bytes.CutPrefix(data, prefixSeq)
	if !ok {
		return 0, 0, false
	}
	seq, rest, ok = parseUint(rest)
	if !ok {
		return 0, 0, false
	}
	if rest, ok = bytes.CutPrefix(rest, prefixTS); !ok {
		return 0, 0, false
	}
	t, rest, ok := parseUint(rest)
	if !ok || t > math.MaxInt64 || len(rest) == 0 || (rest[0] != ',' && rest[0] != '}') {
		return 0, 0, false
	}
	return seq, int64(t), true
}

// indexKey is bytes.Index for a key that starts with '"'. It searches for the
// key without its quote, because quotes are everywhere in JSON and
// bytes.Index stops at each occurrence of the pattern's first byte.
func indexKey(b, key []byte) int {
	tail := key[1:]
	for off := 0; ; {
		i := bytes.Index(b[off:], tail)
		if i < 0 {
			return -1
		}
		if i += off; i > 0 && b[i-1] == '"' {
			return i - 1
		}
		off = i + 1
	}
}

// uintAfter parses the unsigned decimal integer that follows the first key in b.
func uintAfter(b, key []byte) (uint64, bool) {
	i := indexKey(b, key)
	if i < 0 {
		return 0, false
	}
	n, _, ok := parseUint(skipSpace(b[i+len(key):]))
	return n, ok
}

// parseUint parses the decimal digits at the start of b.
func parseUint(b []byte) (n uint64, rest []byte, ok bool) {
	digits := 0
	for ; digits < len(b); digits++ {
		d := b[digits] - '0' // wraps for bytes below '0'
		if d > 9 {
			break
		}
		// 19 digits always fit in a uint64; only a 20th can overflow, so the
		// check stays off the common path (a unix-ns ts has 19 digits).
		if digits >= 19 && (digits > 19 || n > (math.MaxUint64-uint64(d))/10) {
			return 0, nil, false
		}
		n = n*10 + uint64(d)
	}
	return n, b[digits:], digits > 0
}

func skipSpace(b []byte) []byte {
	for len(b) > 0 && (b[0] == ' ' || b[0] == '\t' || b[0] == '\r' || b[0] == '\n') {
		b = b[1:]
	}
	return b
}
