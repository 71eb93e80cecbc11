package loadtest

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
)

// gqlNext is a next message as the gateway writes it for our subscription.
func gqlNext(cursor string, data []byte) string {
	return `{"id":"s1","type":"next","payload":{"data":{"events":{"subject":"loadtest.x.hot","cursor":` + cursor + `,"data":` + string(data) + `}}}}`
}

func TestParseNext(t *testing.T) {
	tricky := `{"seq":3,"ts":7,"pad":"\"data\":{\"seq\":99,\"ts\":1}} } \\"}`
	tests := []struct {
		name   string
		msg    string
		kind   msgKind
		seq    uint64
		ts     int64
		cursor string
	}{
		{"gateway layout", gqlNext(`"js:5"`, appendPayload(nil, 12, 1764500000000000000, 256)), kindEvent, 12, 1764500000000000000, "js:5"},
		{"cursor null", gqlNext(`null`, appendPayload(nil, 4, 42, 64)), kindEvent, 4, 42, ""},
		{"redis cursor", gqlNext(`"rs:1764500000000-3"`, []byte(`{"seq":1,"ts":2}`)), kindEvent, 1, 2, "rs:1764500000000-3"},
		{"data before subject and cursor",
			`{"id":"s1","type":"next","payload":{"data":{"events":{"data":{"seq":8,"ts":9},"cursor":"js:8","subject":"a.b"}}}}`, kindEvent, 8, 9, "js:8"},
		{"envelope in another order",
			`{"payload":{"data":{"events":{"subject":"a","cursor":"js:2","data":{"seq":2,"ts":3}}}},"type":"next","id":"s1"}`, kindEvent, 2, 3, "js:2"},
		{"another id", `{"id":"7","type":"next","payload":{"data":{"events":{"subject":"a","cursor":null,"data":{"seq":6,"ts":6}}}}}`, kindEvent, 6, 6, ""},
		{"whitespace",
			"{ \"id\" : \"s1\" ,\n \"type\" : \"next\" , \"payload\" : { \"data\" : { \"events\" : { \"cursor\" : \"js:1\" , \"data\" : { \"ts\" : 5 , \"seq\" : 4 } } } } }", kindEvent, 4, 5, "js:1"},
		{"data and braces inside strings, seq after pad",
			`{"id":"s1","type":"next","payload":{"data":{"events":{"subject":"a","cursor":"js:3","data":{"pad":"\"data\":{\"seq\":99}}","ts":7,"seq":3}}}}}`, kindEvent, 3, 7, "js:3"},
		{"escaped quotes and backslashes in data", gqlNext(`"js:3"`, []byte(tricky)), kindEvent, 3, 7, "js:3"},
		{"data key in the subject", `{"id":"s1","type":"next","payload":{"data":{"events":{"subject":"\"data\":{\"seq\":1,\"ts\":1}","data":{"seq":5,"ts":6}}}}}`,
			kindEvent, 5, 6, ""},
		{"nested data before events data", `{"type":"next","payload":{"data":{"events":{"x":{"data":{"seq":1,"ts":1}},"data":{"seq":2,"ts":2}}}}}`, kindEvent, 2, 2, ""},
		{"seq only inside pad", gqlNext(`"js:1"`, []byte(`{"pad":"{\"seq\":1,\"ts\":2}"}`)), kindMalformed, 0, 0, "js:1"},
		{"seq not an integer", gqlNext(`null`, []byte(`{"ts":1,"seq":1.5}`)), kindMalformed, 0, 0, ""},
		{"ts over int64", gqlNext(`null`, []byte(`{"seq":1,"ts":9223372036854775808}`)), kindMalformed, 0, 0, ""},
		{"no data", `{"id":"s1","type":"next","payload":{"data":{"events":{"subject":"a","cursor":"js:1"}}}}`, kindMalformed, 0, 0, "js:1"},
		{"execution error", `{"id":"s1","type":"next","payload":{"data":null,"errors":[{"message":"boom"}]}}`, kindError, 0, 0, ""},
		{"error", `{"id":"s1","type":"error","payload":[{"message":"bad","extensions":{"code":"bad_pattern"}}]}`, kindError, 0, 0, ""},
		{"complete", `{"id":"s1","type":"complete"}`, kindError, 0, 0, ""},
		{"pong", `{"type":"pong"}`, kindOther, 0, 0, ""},
		{"connection_ack", `{"type":"connection_ack"}`, kindOther, 0, 0, ""},
		{"nextish is not next", `{"type":"nextish","payload":{"data":{"events":{"data":{"seq":1,"ts":1}}}}}`, kindOther, 0, 0, ""},
		{"no type", `{"payload":{"data":{"events":{"data":{"seq":1,"ts":1}}}}}`, kindMalformed, 0, 0, ""},
		{"type only inside payload", `{"payload":{"type":"next"}}`, kindMalformed, 0, 0, ""},
		{"events not an object", `{"type":"next","payload":{"data":{"events":[1]}}}`, kindMalformed, 0, 0, ""},
		{"truncated", gqlNext(`"js:1"`, []byte(`{"seq":1,"ts":2`))[:60], kindMalformed, 0, 0, ""},
		{"unterminated string", `{"type":"next","payload":{"data":{"events":{"subject":"a`, kindMalformed, 0, 0, ""},
		{"empty", ``, kindMalformed, 0, 0, ""},
		{"garbage", `hello`, kindMalformed, 0, 0, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			kind, seq, ts := parseNext([]byte(tt.msg))
			if kind != tt.kind || seq != tt.seq || ts != tt.ts {
				t.Errorf("parseNext(%s) = (%d, %d, %d), want (%d, %d, %d)", tt.msg, kind, seq, ts, tt.kind, tt.seq, tt.ts)
			}
			if got := nextCursor([]byte(tt.msg)); got != tt.cursor {
				t.Errorf("nextCursor(%s) = %q, want %q", tt.msg, got, tt.cursor)
			}
		})
	}
}

// TestHandleFrameGraphQL feeds GraphQL messages, one per frame, through a
// client's frame handler: a message is never split at a newline, and a
// drop keeps the event's cursor.
func TestHandleFrameGraphQL(t *testing.T) {
	ev := func(seq int) string {
		return gqlNext(fmt.Sprintf(`"js:%d"`, seq+10), appendPayload(nil, uint64(seq), 1000, 64))
	}
	c := &client{gql: true, v: newVerifier(5)}
	for _, f := range []string{ev(1), ev(3), ev(3), `{"type":"pong"}`, `{"oops":1}`,
		`{"id":"s1","type":"error","payload":[{"message":"x"}]}`,
		// A newline inside a string (the published JSON's own business)
		// does not split a GraphQL message.
		gqlNext(`"js:14"`, []byte("{\"seq\":4,\"ts\":1000,\"pad\":\"a\nb\"}"))} {
		if c.handleFrame([]byte(f), 5000) {
			t.Fatalf("drop without a reconnector")
		}
	}
	got := []int64{c.v.delivered, c.v.gaps, c.v.dups, c.v.missing(), c.serverErrors, c.malformed}
	if want := []int64{4, 1, 1, 2, 1, 1}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("delivered, gaps, dups, missing, errors, malformed = %v, want %v", got, want)
	}
	if c.lat.n != 4 || c.lat.max != 4000 || !strings.Contains(c.firstServerError, `"type":"error"`) {
		t.Errorf("latency n=%d max=%d, first error %q", c.lat.n, c.lat.max, c.firstServerError)
	}

	d := &client{gql: true, v: newVerifier(5), rc: &reconnector{points: []int64{2}}}
	if d.handleFrame([]byte(ev(1)), 5000) || !d.handleFrame([]byte(ev(2)), 5000) || d.rc.cursor != "js:12" {
		t.Errorf("drop after 2 events: cursor %q, want js:12", d.rc.cursor)
	}
}

// TestHandleFrameGraphQLAllocs proves the per-event GraphQL path allocates
// nothing.
func TestHandleFrameGraphQLAllocs(t *testing.T) {
	msg := []byte(gqlNext(`"js:1"`, appendPayload(nil, 1, 1764500000000000000, 256)))
	c := &client{gql: true, v: newVerifier(1)}
	if allocs := testing.AllocsPerRun(100, func() { c.handleFrame(msg, 1764500000001000000) }); allocs != 0 {
		t.Fatalf("handleFrame allocates %.1f times per GraphQL event, want 0", allocs)
	}
}

func BenchmarkParseNext(b *testing.B) {
	msg := []byte(gqlNext(`"js:123456"`, appendPayload(nil, 1, 1764500000000000000, 256)))
	c := &client{gql: true, v: newVerifier(1)}
	b.ReportAllocs()
	b.SetBytes(int64(len(msg)))
	for b.Loop() {
		c.handleFrame(msg, 1764500000001000000)
	}
}

// FuzzParseNext: arbitrary input must not panic, and an event must carry
// integers that really are in the message.
func FuzzParseNext(f *testing.F) {
	f.Add([]byte(gqlNext(`"js:5"`, []byte(`{"seq":12,"ts":99,"pad":"x"}`))))
	f.Add([]byte(`{"type":"next","payload":{"data":{"events":{"data":{"pad":"\\\"","seq":1,"ts":2}}}}}`))
	f.Add([]byte(`{"id":"s1","type":"error","payload":[]}`))
	f.Fuzz(func(t *testing.T, msg []byte) {
		kind, seq, ts := parseNext(msg)
		_ = nextCursor(msg)
		if kind != kindEvent {
			if seq != 0 || ts != 0 {
				t.Fatalf("kind %d with seq %d ts %d", kind, seq, ts)
			}
			return
		}
		if ts < 0 || !bytes.Contains(msg, fmt.Appendf(nil, "%d", seq)) || !bytes.Contains(msg, fmt.Appendf(nil, "%d", ts)) {
			t.Fatalf("event (%d, %d) not in %q", seq, ts, msg)
		}
	})
}
