package loadtest

import (
	"testing"
	"time"
)

func TestBucketBounds(t *testing.T) {
	// Every value lands in a bucket whose range holds it, and the bucket is at
	// most 1/16 of the value wide.
	prev := -1
	for _, v := range []int64{0, 1, 15, 16, 17, 31, 32, 33, 1000, 1023, 1024, 999_999, 1_000_000, 1 << 30, histTop - 1, histTop} {
		i := bucketOf(v)
		if i < prev || i >= histBuckets {
			t.Fatalf("bucketOf(%d) = %d (previous %d, buckets %d)", v, i, prev, histBuckets)
		}
		prev = i
		lo := int64(0)
		if i > 0 {
			lo = bucketUpper(i-1) + 1
		}
		hi := bucketUpper(i)
		if v < lo || v > hi {
			t.Errorf("value %d in bucket %d = [%d, %d]", v, i, lo, hi)
		}
		if hi-lo+1 > max(1, v/16+1) {
			t.Errorf("bucket %d = [%d, %d] is wider than 1/16 of %d", i, lo, hi, v)
		}
	}
	if bucketOf(int64(60*time.Second)) >= histBuckets {
		t.Errorf("60s does not fit")
	}
}

func TestHistogramQuantiles(t *testing.T) {
	var h histogram
	// 1µs, 2µs, …, 10000µs: quantile q is q·10ms.
	for i := int64(1); i <= 10000; i++ {
		h.record(i * int64(time.Microsecond))
	}
	tests := []struct {
		q    float64
		want time.Duration
	}{
		{0.50, 5000 * time.Microsecond},
		{0.95, 9500 * time.Microsecond},
		{0.99, 9900 * time.Microsecond},
		{1.00, 10000 * time.Microsecond},
		{0.0001, 1 * time.Microsecond},
	}
	for _, tt := range tests {
		got := h.quantile(tt.q)
		// The answer is the upper bound of the right bucket: never low, at most 6.25% high.
		if got < tt.want || float64(got) > float64(tt.want)*1.0625 {
			t.Errorf("quantile(%v) = %v, want %v (+6.25%%)", tt.q, got, tt.want)
		}
	}
	if h.max != int64(10*time.Millisecond) {
		t.Errorf("max = %v, want exactly 10ms", time.Duration(h.max))
	}
	if m := h.mean(); m != 5000500*time.Nanosecond {
		t.Errorf("mean = %v, want 5.0005ms", m)
	}
}

func TestHistogramEdges(t *testing.T) {
	var empty histogram
	if empty.quantile(0.5) != 0 || empty.mean() != 0 {
		t.Errorf("empty histogram: p50 %v mean %v, want 0", empty.quantile(0.5), empty.mean())
	}

	var h histogram
	h.record(-5) // clock step: counts as zero
	h.record(7)
	h.record(int64(2 * time.Minute)) // past the top bucket: clamped there, max stays exact
	if got := h.quantile(0.33); got != 0 {
		t.Errorf("p33 = %v, want 0", got)
	}
	if got := h.quantile(0.5); got != 7 {
		t.Errorf("p50 = %v, want 7ns (exact below 16ns)", got)
	}
	if got := h.quantile(1); got != 2*time.Minute {
		t.Errorf("p100 = %v, want the exact max 2m", got)
	}

	var one histogram
	one.record(int64(1234567 * time.Nanosecond))
	if got := one.quantile(0.99); got != 1234567*time.Nanosecond {
		t.Errorf("single value: p99 = %v, want it capped at the exact max", got)
	}
}

func TestHistogramMerge(t *testing.T) {
	var a, b, all histogram
	for i := int64(1); i <= 1000; i++ {
		v := i * i * 997 % 50_000_000
		all.record(v)
		if i%3 == 0 {
			a.record(v)
		} else {
			b.record(v)
		}
	}
	a.merge(&b)
	if a != all {
		t.Fatalf("merged histogram differs from recording everything into one")
	}
}
