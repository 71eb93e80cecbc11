package loadtest

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
)

func TestParseMessage(t *testing.T) {
	tests := []struct {
		name string
		msg  string
		kind msgKind
		seq  uint64
		ts   int64
	}{
		{"event", `{"type":"event","subject":"loadtest.x.hot","subs":["s1"],"data":{"seq":12,"ts":1764500000000000000,"pad":"xxx"}}`,
			kindEvent, 12, 1764500000000000000},
		{"cursor field", `{"type":"event","subject":"loadtest.x.hot","cursor":"js:5","subs":["s1"],"data":{"seq":5,"ts":42,"pad":""}}`,
			kindEvent, 5, 42},
		{"extra fields and other key order", `{"subs":["s1","s2"],"type":"event","node":"n1","data":{"ts":7,"pad":"xx","seq":3},"subject":"a.b"}`,
			kindEvent, 3, 7},
		{"whitespace", `{"type": "event", "data": {"seq": 9, "ts": 10}}`, kindEvent, 9, 10},
		{"no pad", `{"type":"event","subject":"a","subs":["s1"],"data":{"seq":1,"ts":2}}`, kindEvent, 1, 2},
		{"max ts", `{"type":"event","data":{"seq":18446744073709551615,"ts":9223372036854775807}}`,
			kindEvent, 18446744073709551615, 9223372036854775807},
		{"ts over int64", `{"type":"event","data":{"seq":1,"ts":9223372036854775808}}`, kindMalformed, 0, 0},
		{"seq over uint64", `{"type":"event","data":{"seq":18446744073709551616,"ts":1}}`, kindMalformed, 0, 0},
		{"seq with 21 digits", `{"type":"event","data":{"seq":123456789012345678901,"ts":1}}`, kindMalformed, 0, 0},
		{"seq not a number", `{"type":"event","data":{"seq":"12","ts":1}}`, kindMalformed, 0, 0},
		{"negative ts", `{"type":"event","data":{"seq":1,"ts":-5}}`, kindMalformed, 0, 0},
		{"no ts", `{"type":"event","data":{"seq":1}}`, kindMalformed, 0, 0},
		{"no data", `{"type":"event","subject":"a","seq":1,"ts":2}`, kindMalformed, 0, 0},
		{"seq only before data", `{"type":"event","seq":1,"ts":2,"data":{"pad":""}}`, kindMalformed, 0, 0},
		{"error", `{"type":"error","code":"bad_pattern","message":"nope"}`, kindError, 0, 0},
		{"pong", `{"type":"pong"}`, kindOther, 0, 0},
		{"subscribed", `{"type":"subscribed","id":"s1"}`, kindOther, 0, 0},
		{"leave", `{"type":"leave","subject":"db.orders.42","cursor":"js:130","subs":["s1"]}`, kindLeave, 0, 0},
		{"synced", `{"type":"synced","id":"s1","cursor":"js:140"}`, kindSynced, 0, 0},
		{"eventual is not event", `{"type":"eventual","data":{"seq":1,"ts":2}}`, kindOther, 0, 0},
		{"empty", ``, kindOther, 0, 0},
		{"blank", " \r", kindOther, 0, 0},
		{"no type", `{"data":{"seq":1,"ts":2}}`, kindMalformed, 0, 0},
		{"garbage", `hello`, kindMalformed, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			kind, seq, ts := parseMessage([]byte(tt.msg))
			if kind != tt.kind || seq != tt.seq || ts != tt.ts {
				t.Errorf("parseMessage(%s) = (%d, %d, %d), want (%d, %d, %d)", tt.msg, kind, seq, ts, tt.kind, tt.seq, tt.ts)
			}
		})
	}
}

func TestEventCursor(t *testing.T) {
	tests := []struct{ name, msg, want string }{
		{"jetstream", `{"type":"event","subject":"a","cursor":"js:42","subs":["s1"],"data":{"seq":1,"ts":2}}`, "js:42"},
		{"redis", `{"type":"event","subject":"a","cursor":"rs:1764500000000-3","subs":["s1"],"data":{"seq":1,"ts":2}}`, "rs:1764500000000-3"},
		{"whitespace", `{"type":"event", "cursor": "js:7", "data":{}}`, "js:7"},
		{"core nats", `{"type":"event","subject":"a","subs":["s1"],"data":{"seq":1,"ts":2}}`, ""},
		{"only inside data", `{"type":"event","subject":"a","data":{"cursor":"js:9"}}`, ""},
		{"not a string", `{"type":"event","cursor":7,"data":{}}`, ""},
		{"unterminated", `{"type":"event","cursor":"js:7`, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := eventCursor([]byte(tt.msg)); got != tt.want {
				t.Errorf("eventCursor(%s) = %q, want %q", tt.msg, got, tt.want)
			}
		})
	}
}

// TestHandleFrame feeds whole frames, several messages each, through a
// client's frame handler and checks what it counted.
func TestHandleFrame(t *testing.T) {
	ev := func(seq int) string {
		return fmt.Sprintf(`{"type":"event","subject":"loadtest.x.hot","cursor":"js:%d","subs":["s1"],"data":%s}`,
			seq, appendPayload(nil, uint64(seq), 1000, 64))
	}
	tests := []struct {
		name                           string
		frames                         []string
		delivered, gaps, dups, missing int64
		errors, malformed              int64
		leaves                         int64
	}{
		{"one event per frame", []string{ev(1), ev(2), ev(3), ev(4)}, 4, 0, 0, 0, 0, 0, 0},
		{"all in one frame", []string{strings.Join([]string{ev(1), ev(2), ev(3), ev(4)}, "\n")}, 4, 0, 0, 0, 0, 0, 0},
		{"trailing newline and pong", []string{ev(1) + "\n" + `{"type":"pong"}` + "\n" + ev(2) + "\n", ev(3) + "\n" + ev(4) + "\n"}, 4, 0, 0, 0, 0, 0, 0},
		{"gap and duplicate across frames", []string{ev(1) + "\n" + ev(3), ev(3) + "\n" + ev(4)}, 4, 1, 1, 1, 0, 0, 0},
		{"error and malformed", []string{ev(1) + "\n" + `{"type":"error","code":"x"}` + "\n" + `{"oops":1}`}, 1, 0, 0, 3, 1, 1, 0},
		{"leave and synced", []string{ev(1) + "\n" + `{"type":"leave","subject":"a","subs":["s1"]}` + "\n" + `{"type":"synced","id":"s1"}`}, 1, 0, 0, 3, 0, 0, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := &client{v: newVerifier(4)}
			for _, f := range tt.frames {
				c.handleFrame([]byte(f), 5000)
			}
			got := []int64{c.v.delivered, c.v.gaps, c.v.dups, c.v.missing(), c.serverErrors, c.malformed, c.leaves}
			want := []int64{tt.delivered, tt.gaps, tt.dups, tt.missing, tt.errors, tt.malformed, tt.leaves}
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Errorf("delivered, gaps, dups, missing, errors, malformed, leaves = %v, want %v", got, want)
			}
			if c.delivered.Load() != tt.delivered {
				t.Errorf("atomic delivered = %d, want %d", c.delivered.Load(), tt.delivered)
			}
			if c.lat.n != uint64(tt.delivered) || (tt.delivered > 0 && c.lat.max != 4000) {
				t.Errorf("latency n=%d max=%d, want n=%d max=4000", c.lat.n, c.lat.max, tt.delivered)
			}
			if tt.errors > 0 && !strings.Contains(c.firstServerError, `"code":"x"`) {
				t.Errorf("firstServerError = %q", c.firstServerError)
			}
		})
	}
}

// benchFrame is a frame of 64 events of 256-byte payloads, as the gateway
// sends them under load.
func benchFrame(events int) []byte {
	var b []byte
	for i := 1; i <= events; i++ {
		if i > 1 {
			b = append(b, '\n')
		}
		b = append(b, `{"type":"event","subject":"loadtest.0123456789ab.hot","cursor":"js:1","subs":["s1"],"data":`...)
		b = appendPayload(b, uint64(i), 1764500000000000000, 256)
		b = append(b, '}')
	}
	return b
}

// TestHandleFrameAllocs proves the per-event path (split, parse, verify,
// record latency) allocates nothing.
func TestHandleFrameAllocs(t *testing.T) {
	frame := benchFrame(64)
	c := &client{v: newVerifier(64)}
	allocs := testing.AllocsPerRun(100, func() { c.handleFrame(frame, 1764500000001000000) })
	if allocs != 0 {
		t.Fatalf("handleFrame allocates %.1f times per 64-event frame, want 0", allocs)
	}
}

func BenchmarkParseFrame(b *testing.B) {
	const perFrame = 64
	frame := benchFrame(perFrame)
	c := &client{v: newVerifier(perFrame)}
	b.ReportAllocs()
	b.SetBytes(int64(len(frame)))
	for b.Loop() {
		c.handleFrame(frame, 1764500000001000000)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*perFrame), "ns/event")
}

// FuzzParseMessage: arbitrary input must not panic, and an event must carry
// integers that really are in the message.
func FuzzParseMessage(f *testing.F) {
	f.Add([]byte(`{"type":"event","subject":"a","cursor":"js:5","subs":["s1"],"data":{"seq":12,"ts":99,"pad":"x"}}`))
	f.Add([]byte(`{"type":"error","code":"bad_frame"}`))
	f.Add([]byte(`{"type":"event","data":{"seq":`))
	f.Add([]byte(`{"type":"event","data":{"seq":1,"ts":99999999999999999999}}`))
	f.Fuzz(func(t *testing.T, msg []byte) {
		kind, seq, ts := parseMessage(msg)
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

// FuzzPayloadRoundTrip: every payload we publish, wrapped as the gateway
// wraps it, parses back to its seq and ts.
func FuzzPayloadRoundTrip(f *testing.F) {
	f.Add(uint64(1), int64(1764500000000000000), 256)
	f.Add(uint64(0), int64(0), 0)
	f.Add(uint64(1<<64-1), int64(1<<63-1), 5000)
	f.Fuzz(func(t *testing.T, seq uint64, ts int64, size int) {
		if ts < 0 || size < 0 || size > 1<<16 {
			t.Skip()
		}
		msg := append([]byte(`{"type":"event","subject":"a.b","subs":["s1"],"data":`), appendPayload(nil, seq, ts, size)...)
		msg = append(msg, '}')
		kind, gotSeq, gotTS := parseMessage(msg)
		if kind != kindEvent || gotSeq != seq || gotTS != ts {
			t.Fatalf("parse(%.300s) = (%d, %d, %d), want event (%d, %d)", msg, kind, gotSeq, gotTS, seq, ts)
		}
	})
}
