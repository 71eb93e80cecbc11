package loadtest

import (
	"math"
	"math/bits"
	"time"
)

// histogram is a log-linear latency histogram in nanoseconds, HDR-style: each
// power of two is split into 16 linear sub-buckets, so a bucket's width is at
// most 1/16 (6.25%) of its values. Values from 0 to 2^36 ns (68.7 s) have their
// own bucket; larger ones land in the top bucket, but max stays exact. 528
// buckets (4.2 KB) per client; each client owns one and Run merges them at the
// end, so recording takes no lock.
type histogram struct {
	counts [histBuckets]uint64
	n      uint64
	sum    float64 // for the mean; float so that long runs cannot overflow
	max    int64
}

const (
	subBucketBits = 4
	subBuckets    = 1 << subBucketBits
	histBits      = 36 // values below 1<<36 ns are bucketed precisely
	histBuckets   = subBuckets * (histBits - subBucketBits + 1)
	histTop       = 1<<histBits - 1
)

// bucketOf returns the index of the bucket holding v (0 <= v <= histTop).
// Values below 16 have a bucket each; above, a value with bit length k falls
// in octave k-5, sub-bucket v>>(k-5) - 16.
func bucketOf(v int64) int {
	if v < subBuckets {
		return int(v)
	}
	e := bits.Len64(uint64(v)) - subBucketBits - 1
	return e*subBuckets + int(v>>e)
}

// bucketUpper is the largest value that falls in bucket i.
func bucketUpper(i int) int64 {
	if i < subBuckets {
		return int64(i)
	}
	e := i/subBuckets - 1
	m := int64(i%subBuckets + subBuckets)
	return (m+1)<<e - 1
}

// record adds one latency; negative values (clock steps) count as zero.
func (h *histogram) record(ns int64) {
	ns = max(ns, 0)
	h.max = max(h.max, ns)
	h.n++
	h.sum += float64(ns)
	h.counts[bucketOf(min(ns, histTop))]++
}

// merge adds o's counts into h.
func (h *histogram) merge(o *histogram) {
	for i, c := range o.counts {
		h.counts[i] += c
	}
	h.n += o.n
	h.sum += o.sum
	h.max = max(h.max, o.max)
}

// quantile returns the value at quantile q (0 < q <= 1): the upper bound of the
// bucket holding the ceil(q·n)-th smallest value, capped at the exact max, so
// it errs high by at most one bucket width. An empty histogram returns 0.
func (h *histogram) quantile(q float64) time.Duration {
	if h.n == 0 {
		return 0
	}
	rank := uint64(math.Ceil(q * float64(h.n)))
	rank = min(max(rank, 1), h.n)
	var seen uint64
	for i, c := range h.counts {
		seen += c
		if seen >= rank {
			if i == histBuckets-1 {
				return time.Duration(h.max) // the top bucket also holds clamped values
			}
			return time.Duration(min(bucketUpper(i), h.max))
		}
	}
	return time.Duration(h.max)
}

func (h *histogram) mean() time.Duration {
	if h.n == 0 {
		return 0
	}
	return time.Duration(h.sum / float64(h.n))
}
