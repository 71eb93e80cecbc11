package loadtest

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
)

func TestAppendPayload(t *testing.T) {
	tests := []struct {
		seq  uint64
		ts   int64
		size int
	}{
		{1, 1764500000000000000, 256},
		{20000, 1764500000000000000, 256},
		{1, 0, 1},      // too small for the fixed part: no pad
		{1, 1, 20},     // exactly the fixed part with an empty pad
		{123, 456, 26}, // one byte of pad
		{1, 1764500000000000000, 64 << 10},
		{1<<64 - 1, 1<<63 - 1, 300},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("seq%d/size%d", tt.seq, tt.size), func(t *testing.T) {
			prefix := []byte("keep")
			b := appendPayload(prefix, tt.seq, tt.ts, tt.size)
			if string(b[:4]) != "keep" {
				t.Fatalf("prefix overwritten: %q", b[:4])
			}
			p := b[4:]
			if !json.Valid(p) {
				t.Fatalf("invalid JSON: %s", p)
			}
			var got struct {
				Seq uint64  `json:"seq"`
				TS  int64   `json:"ts"`
				Pad *string `json:"pad"`
			}
			if err := json.Unmarshal(p, &got); err != nil {
				t.Fatal(err)
			}
			if got.Seq != tt.seq || got.TS != tt.ts {
				t.Errorf("decoded seq %d ts %d, want %d %d", got.Seq, got.TS, tt.seq, tt.ts)
			}
			fixed := len(fmt.Sprintf(`{"seq":%d,"ts":%d,"pad":""}`, tt.seq, tt.ts))
			switch {
			case tt.size >= fixed:
				if len(p) != tt.size {
					t.Errorf("len = %d, want exactly %d", len(p), tt.size)
				}
				if got.Pad == nil || strings.Trim(*got.Pad, "x") != "" {
					t.Errorf("pad = %v, want only x", got.Pad)
				}
			case got.Pad != nil:
				t.Errorf("size %d below the fixed part %d, yet padded: %s", tt.size, fixed, p)
			}
			if !strings.HasPrefix(string(p), fmt.Sprintf(`{"seq":%d,"ts":%d`, tt.seq, tt.ts)) {
				t.Errorf("key order changed (the parser relies on seq, ts before pad): %.80s", p)
			}
		})
	}
}

func TestAppendPayloadAllocs(t *testing.T) {
	buf := make([]byte, 0, 512)
	allocs := testing.AllocsPerRun(100, func() { buf = appendPayload(buf[:0], 12345, 1764500000000000000, 256) })
	if allocs != 0 {
		t.Fatalf("appendPayload into a large enough buffer allocates %.1f times, want 0", allocs)
	}
}

// TestAppendDocPayload: a view run's payload is valid JSON of exactly the
// size asked for, carries its customer's document, and keeps seq and ts
// first for the parser's fast path.
func TestAppendDocPayload(t *testing.T) {
	for _, tt := range []struct {
		seq, customer uint64
		size          int
	}{{1, 0, 256}, {20000, 9999, 256}, {7, 3, 10}, {1<<64 - 1, 1<<64 - 1, 300}} {
		t.Run(fmt.Sprintf("seq%d/customer%d/size%d", tt.seq, tt.customer, tt.size), func(t *testing.T) {
			p := appendDocPayload(nil, tt.seq, 1764500000000000000, tt.size, tt.customer)
			var got struct {
				Seq uint64 `json:"seq"`
				TS  int64  `json:"ts"`
				Doc struct {
					CustomerID uint64      `json:"customer_id"`
					Total      json.Number `json:"total"`
				} `json:"doc"`
			}
			if err := json.Unmarshal(p, &got); err != nil {
				t.Fatalf("%s: %v", p, err)
			}
			if got.Seq != tt.seq || got.Doc.CustomerID != tt.customer || got.Doc.Total.String() != fmt.Sprintf("%d.5", tt.customer) {
				t.Errorf("decoded %+v from %s", got, p)
			}
			if fixed := len(appendDocPayload(nil, tt.seq, 1764500000000000000, 0, tt.customer)) + len(`,"pad":""`); tt.size >= fixed && len(p) != tt.size {
				t.Errorf("len = %d, want %d", len(p), tt.size)
			}
			kind, seq, ts := parseMessage([]byte(`{"type":"event","subject":"a.0.0","subs":["s1"],"data":` + string(p) + `}`))
			if kind != kindEvent || seq != tt.seq || ts != 1764500000000000000 {
				t.Errorf("parsed as (%d, %d, %d)", kind, seq, ts)
			}
		})
	}
	buf := make([]byte, 0, 512)
	if allocs := testing.AllocsPerRun(100, func() { buf = appendDocPayload(buf[:0], 12345, 1764500000000000000, 256, 42) }); allocs != 0 {
		t.Errorf("appendDocPayload allocates %.1f times, want 0", allocs)
	}
}
