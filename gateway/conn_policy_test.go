package gateway

import (
	"testing"
	"time"
)

// TestTokenBucketSheds: past the burst, a bucket drops every message until
// it holds a second's worth of tokens again, even though single tokens
// come back earlier: the messages it drops are one run, so a client that
// resends them after a pause keeps their order.
func TestTokenBucketSheds(t *testing.T) {
	const rate = 10 // burst 20
	var b tokenBucket
	t0 := time.Unix(1000, 0)
	for i := range 20 {
		if !b.allow(t0, rate) {
			t.Fatalf("message %d of the burst dropped", i)
		}
	}
	if b.allow(t0, rate) {
		t.Fatal("message 21 of a burst of 20 allowed")
	}
	// 0.5 s later five tokens are back: a bucket that did not shed would
	// let the next message through, out of order with the one dropped.
	for _, d := range []time.Duration{100 * time.Millisecond, 500 * time.Millisecond, 999 * time.Millisecond} {
		if b.allow(t0.Add(d), rate) {
			t.Fatalf("allowed %v after a drop, while shedding", d)
		}
	}
	// A second after the first drop (the drops took no tokens): rate tokens.
	at := t0.Add(time.Second)
	for i := range rate {
		if !b.allow(at, rate) {
			t.Fatalf("message %d after the shedding ended dropped", i)
		}
	}
	if b.allow(at, rate) {
		t.Fatal("more than rate messages after the shedding ended")
	}
	// No limit: never drops.
	var free tokenBucket
	for range 1000 {
		if !free.allow(t0, 0) {
			t.Fatal("rate 0 dropped a message")
		}
	}
}
