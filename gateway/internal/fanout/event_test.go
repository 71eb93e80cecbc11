package fanout

import (
	"bytes"
	"encoding/json"
	"reflect"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"
)

// decodedEvent is an event delivery as a client sees it.
type decodedEvent struct {
	keys    []string // object keys, in order
	typ     string
	subject string
	cursor  *string
	subs    []string
	data    json.RawMessage
}

// decodeDelivery checks that b is one valid JSON object with exactly the
// event keys and decodes it.
func decodeDelivery(t testing.TB, b []byte) decodedEvent {
	t.Helper()
	if !json.Valid(b) {
		t.Fatalf("delivery is not valid JSON: %q", b)
	}
	var ev decodedEvent
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		t.Fatalf("delivery %q does not start with an object: %v %v", b, tok, err)
	}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			t.Fatalf("delivery %q: %v", b, err)
		}
		key := tok.(string)
		if slices.Contains(ev.keys, key) {
			t.Fatalf("delivery %q: duplicate key %q", b, key)
		}
		ev.keys = append(ev.keys, key)
		var v any
		switch key {
		case "type":
			v = &ev.typ
		case "subject":
			v = &ev.subject
		case "cursor":
			v = &ev.cursor
		case "subs":
			v = &ev.subs
		case "data":
			v = &ev.data
		default:
			t.Fatalf("delivery %q: unexpected key %q", b, key)
		}
		if err := dec.Decode(v); err != nil {
			t.Fatalf("delivery %q: key %q: %v", b, key, err)
		}
	}
	return ev
}

// sameJSON reports whether a and b decode to the same value.
func sameJSON(t testing.TB, a, b []byte) bool {
	t.Helper()
	decode := func(x []byte) any {
		d := json.NewDecoder(bytes.NewReader(x))
		d.UseNumber()
		var v any
		if err := d.Decode(&v); err != nil {
			t.Fatalf("decode %q: %v", x, err)
		}
		return v
	}
	return reflect.DeepEqual(decode(a), decode(b))
}

// checkSplice builds ev's delivery for ids and checks it against the inputs.
func checkSplice(t testing.TB, ev *Event, subject, cursor string, data []byte, ids []string) []byte {
	t.Helper()
	subs := EncodeSubsList(ids)
	it := Item{Ev: ev, Subs: subs}
	out := it.AppendTo(nil)
	if len(out) != it.Size() || len(out) != it.WireLen() {
		t.Fatalf("len(delivery) = %d, item.Size() = %d, item.WireLen() = %d", len(out), it.Size(), it.WireLen())
	}
	if cap(ev.buf) != len(ev.buf) && !bytes.ContainsAny(data, " \t\r\n") {
		t.Errorf("event buffer sized %d for %d bytes: NewEvent's size computation is off", cap(ev.buf), len(ev.buf))
	}
	if bytes.IndexByte(out, '\n') >= 0 {
		t.Fatalf("delivery contains a raw newline: %q", out)
	}
	got := decodeDelivery(t, out)
	wantKeys := []string{"type", "subject", "subs", "data"}
	if cursor != "" {
		wantKeys = []string{"type", "subject", "cursor", "subs", "data"}
	}
	if !slices.Equal(got.keys, wantKeys) {
		t.Fatalf("delivery %q has keys %q, want %q", out, got.keys, wantKeys)
	}
	if got.typ != "event" {
		t.Errorf("type %q", got.typ)
	}
	if want := string([]rune(subject)); got.subject != want {
		t.Errorf("subject %q, want %q", got.subject, want)
	}
	if cursor != "" && (got.cursor == nil || *got.cursor != string([]rune(cursor))) {
		t.Errorf("cursor %v, want %q", got.cursor, cursor)
	}
	wantIDs := make([]string, len(ids))
	for i, id := range ids {
		wantIDs[i] = string([]rune(id))
	}
	if !slices.Equal(got.subs, wantIDs) {
		t.Errorf("subs %q, want %q", got.subs, wantIDs)
	}
	if !sameJSON(t, got.data, data) {
		t.Errorf("data %s does not decode like the input %q", got.data, data)
	}
	var compact bytes.Buffer
	if err := json.Compact(&compact, data); err != nil {
		t.Fatalf("compact %q: %v", data, err)
	}
	if utf8.Valid(data) && !bytes.Equal(got.data, compact.Bytes()) {
		t.Errorf("data %q, want the input compacted: %q", got.data, compact.Bytes())
	}
	if !utf8.Valid(out) {
		t.Errorf("delivery %q is not valid UTF-8, as a WebSocket text frame must be", out)
	}
	return out
}

func TestEnvelopeNewEvent(t *testing.T) {
	tests := []struct {
		name, subject, cursor, data string
		ids                         []string
		want                        string // exact delivery, when given
	}{
		{"object", "orders.42", "", `{"id":42,"status":"paid"}`, []string{"s1", "s3"},
			`{"type":"event","subject":"orders.42","subs":["s1","s3"],"data":{"id":42,"status":"paid"}}`},
		{"cursor", "orders.42", "js:7", `{"id":42}`, []string{"s1"},
			`{"type":"event","subject":"orders.42","cursor":"js:7","subs":["s1"],"data":{"id":42}}`},
		{"no subs", "a", "", `1`, nil,
			`{"type":"event","subject":"a","subs":[],"data":1}`},
		{"whitespace compacted", "a", "", "{\n  \"a\" : [1, 2,\t3],\r\n  \"b\": \"x y\\n\"\n}\n", []string{"s"},
			`{"type":"event","subject":"a","subs":["s"],"data":{"a":[1,2,3],"b":"x y\n"}}`},
		{"leading and trailing space", "a", "", "  true  ", []string{"s"},
			`{"type":"event","subject":"a","subs":["s"],"data":true}`},
		{"string data", "a", "", `"hi"`, []string{"s"}, ""},
		{"null data", "a", "", `null`, []string{"s"}, ""},
		{"nested", "a", "", `{"a":{"b":[{"c":null},[],{}]}}`, []string{"s"}, ""},
		{"big number kept exactly", "a", "", `12345678901234567890.000000000001e-3`, []string{"s"}, ""},
		{"unicode data", "a", "", `{"k":"zażółć \u2028 😀"}`, []string{"s"}, ""},
		{"quote in subject", `a"b`, "", `1`, []string{"s"},
			`{"type":"event","subject":"a\"b","subs":["s"],"data":1}`},
		{"backslash in subject", `a\b`, "", `1`, []string{"s"},
			`{"type":"event","subject":"a\\b","subs":["s"],"data":1}`},
		{"unicode subject", "zamówienia.ü.😀", "", `1`, []string{"s"},
			`{"type":"event","subject":"zamówienia.ü.😀","subs":["s"],"data":1}`},
		{"invalid UTF-8 subject", "a.\xff\xfe.b", "", `1`, []string{"s"},
			`{"type":"event","subject":"a.\ufffd\ufffd.b","subs":["s"],"data":1}`},
		{"control chars", "a\x00\x1f\n\r\t", "c\x01", `1`, []string{"i\x7f"},
			`{"type":"event","subject":"a\u0000\u001f\n\r\t","cursor":"c\u0001","subs":["i` + "\x7f" + `"],"data":1}`},
		{"escaped ids", "a", "", `1`, []string{`"`, `\`, "é", "\xc3"},
			`{"type":"event","subject":"a","subs":["\"","\\","é","\ufffd"],"data":1}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ev, err := NewEvent(tt.subject, tt.cursor, []byte(tt.data))
			if err != nil {
				t.Fatalf("NewEvent: %v", err)
			}
			if ev.Subject != tt.subject || ev.Cursor != tt.cursor {
				t.Errorf("Event{Subject: %q, Cursor: %q}", ev.Subject, ev.Cursor)
			}
			out := checkSplice(t, ev, tt.subject, tt.cursor, []byte(tt.data), tt.ids)
			if tt.want != "" && string(out) != tt.want {
				t.Errorf("delivery\n got %s\nwant %s", out, tt.want)
			}
		})
	}
}

func TestEnvelopeRejectsInvalidJSON(t *testing.T) {
	for _, data := range []string{
		``, ` `, `{`, `}`, `{"a":}`, `nope`, `{"a":1}x`, `{"a":1}{"b":2}`, `1 2`,
		`'a'`, `{a:1}`, `[1,]`, `NaN`, `"a` + "\n" + `b"`, `"\x"`, `01`,
	} {
		if ev, err := NewEvent("a", "", []byte(data)); err == nil {
			t.Errorf("NewEvent(data %q) accepted: %q", data, ev.buf)
		}
	}
}

// TestEnvelopeOutputIsValidUTF8: every delivery goes out in a WebSocket text
// frame, which RFC 6455 (§5.6, §8.1) requires to be valid UTF-8; a browser
// fails the connection (1007) on anything else. json.Valid does not check
// UTF-8, so NewEvent accepts data whose strings hold invalid UTF-8 and
// splices those bytes into every subscriber's frame unchanged. It should
// reject such data (or replace the bytes, as appendJSONString does for the
// subject).
func TestEnvelopeOutputIsValidUTF8(t *testing.T) {
	for _, data := range []string{
		"\"\xff\"",                 // invalid byte
		"{\"k\":\"\xed\xa0\x80\"}", // UTF-8-encoded surrogate
		"[\"\xc0\x80\"]",           // overlong NUL
		"{\"\xe2\x82\":1}",         // truncated sequence in a key
	} {
		ev, err := NewEvent("a", "", []byte(data))
		if err != nil {
			continue // rejecting is a fix
		}
		out := (Item{Ev: ev, Subs: EncodeSubsList([]string{"s"})}).AppendTo(nil)
		if !utf8.Valid(out) {
			t.Errorf("NewEvent(data %q) accepted; the delivery %q is not valid UTF-8", data, out)
			continue
		}
		// Replacing is a fix too, if the data still means the same (each
		// invalid byte decodes as U+FFFD either way).
		checkSplice(t, ev, "a", "", []byte(data), []string{"s"})
	}
}

func TestEnvelopeControlMessage(t *testing.T) {
	msg := []byte(`{"type":"subscribed","id":"s1"}`)
	it := Item{Ev: NewControl(msg)}
	if it.Size() != len(msg) {
		t.Errorf("size %d, want %d", it.Size(), len(msg))
	}
	if got := it.AppendTo([]byte("x")); string(got) != "x"+string(msg) {
		t.Errorf("appendTo = %q", got)
	}
}

// TestEnvelopeSpliceAppends checks that deliveries append after what dst
// already holds, as the writer builds a frame of several messages.
func TestEnvelopeSpliceAppends(t *testing.T) {
	e1, _ := NewEvent("a", "", []byte(`1`))
	e2, _ := NewEvent("b", "c", []byte(`[2]`))
	subs := EncodeSubsList([]string{"s1", "s2"})
	var frame []byte
	for i, it := range []Item{{Ev: e1, Subs: subs}, {Ev: NewControl([]byte(`{"type":"pong"}`))}, {Ev: e2, Subs: subs}} {
		if i > 0 {
			frame = append(frame, '\n')
		}
		frame = it.AppendTo(frame)
	}
	want := `{"type":"event","subject":"a","subs":["s1","s2"],"data":1}` + "\n" +
		`{"type":"pong"}` + "\n" +
		`{"type":"event","subject":"b","cursor":"c","subs":["s1","s2"],"data":[2]}`
	if string(frame) != want {
		t.Errorf("frame\n got %s\nwant %s", frame, want)
	}
}

func TestEnvelopeEncodeSubsList(t *testing.T) {
	for _, tt := range []struct {
		ids  []string
		want string
	}{
		{nil, `[]`},
		{[]string{"s1"}, `["s1"]`},
		{[]string{"s1", "s3"}, `["s1","s3"]`},
		{[]string{`a"b`, "\n"}, `["a\"b","\n"]`},
	} {
		l := EncodeSubsList(tt.ids)
		if string(l.B) != tt.want {
			t.Errorf("encodeSubsList(%q) = %s, want %s", tt.ids, l.B, tt.want)
		}
		// Sized up front: one allocation for the bytes, one for the list.
		if a := testing.AllocsPerRun(10, func() { EncodeSubsList(tt.ids) }); a > 2 {
			t.Errorf("encodeSubsList(%q): %v allocations, want at most 2", tt.ids, a)
		}
	}
}

// FuzzSplice: whenever NewEvent accepts, every delivery spliced from the
// event is valid JSON with the event's fields and the data round-trips.
// ids is a comma-separated list of subscription ids.
func FuzzSplice(f *testing.F) {
	f.Add("orders.42", "", `{"id":42,"status":"paid"}`, "s1,s3")
	f.Add("a", "js:7", " [1, 2 ,\n3 ] ", "s")
	f.Add(`a"b\c`, "\x00", `"x\n\u2028"`, `"`)
	f.Add("a.\xff", "", `{"k":"v","k":"w"}`, "\xc3")
	f.Add("é", "c", "null", "")
	f.Add("a", "", "{\"k\":\"\xff\"}", "x")
	f.Fuzz(func(t *testing.T, subject, cursor, data, ids string) {
		ev, err := NewEvent(subject, cursor, []byte(data))
		if err != nil {
			if json.Valid([]byte(data)) {
				t.Fatalf("NewEvent rejected valid JSON %q: %v", data, err)
			}
			return
		}
		if !json.Valid([]byte(data)) {
			t.Fatalf("NewEvent accepted invalid JSON %q", data)
		}
		var list []string
		if ids != "" {
			list = strings.Split(ids, ",")
		}
		checkSplice(t, ev, subject, cursor, []byte(data), list)
	})
}

// TestEnvelopeSpliceAllocs guards the writer's hot path: splicing a delivery
// into a frame buffer with room allocates nothing.
func TestEnvelopeSpliceAllocs(t *testing.T) {
	ev, err := NewEvent("orders.42", "js:7", []byte(`{"id":42,"status":"paid"}`))
	if err != nil {
		t.Fatal(err)
	}
	items := []Item{
		{Ev: ev, Subs: EncodeSubsList([]string{"s1", "s3"})},
		{Ev: NewControl([]byte(`{"type":"pong"}`))},
	}
	dst := make([]byte, 0, 4096)
	allocs := testing.AllocsPerRun(1000, func() {
		dst = dst[:0]
		for _, it := range items {
			dst = it.AppendTo(dst)
		}
	})
	if allocs != 0 {
		t.Errorf("appendTo allocated %v times per run, want 0", allocs)
	}
}

// BenchmarkSplice measures one delivery: a 256-byte event spliced around a
// subscription list into a frame buffer that has room.
func BenchmarkSplice(b *testing.B) {
	data := []byte(`{"id":42,"status":"paid","pad":"` + strings.Repeat("x", 256-len(`{"id":42,"status":"paid","pad":""}`)) + `"}`)
	if len(data) != 256 {
		b.Fatalf("data is %d bytes", len(data))
	}
	ev, err := NewEvent("orders.42", "", data)
	if err != nil {
		b.Fatal(err)
	}
	it := Item{Ev: ev, Subs: EncodeSubsList([]string{"s1", "s3"})}
	dst := make([]byte, 0, 64<<10)
	b.ReportAllocs()
	b.SetBytes(int64(it.Size()))
	for b.Loop() {
		dst = it.AppendTo(dst[:0])
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "ns/delivery")
}

// BenchmarkNewEvent is the cost of building one broker message's shared
// event (once per message, whatever its fan-out): a 256-byte document
// with a cursor, compact, as the ingest publishes them.
func BenchmarkNewEvent(b *testing.B) {
	data := []byte(`{"id":42,"customer_id":7,"status":"shipped","total":"129.90","items":[{"sku":"A-1","qty":2},{"sku":"B-22","qty":1}],"note":"` + strings.Repeat("x", 120) + `"}`)
	b.ReportAllocs()
	b.SetBytes(int64(len(data)))
	for b.Loop() {
		if _, err := NewEvent("db.orders.42", "js:123456", data); err != nil {
			b.Fatal(err)
		}
	}
}
