package metrics_test

import (
	"math/rand/v2"
	"testing"

	"github.com/fanwire/fanwire/metrics"
)

// benchRecords are 4,096 deterministic pseudo-random (kind, route) pairs
// over the 8 kinds a busy ingest sees most and the 3 routes.
// A fixed-size array indexed with a constant mask: no bounds check in either
// loop, so the figures compare the counters, not the harness.
var benchRecords = func() *[4096]obs {
	kinds := []metrics.Kind{'B', 'C', 'R', 'I', 'U', 'D', 'T', 'M'}
	rng := rand.New(rand.NewPCG(42, 4096))
	recs := new([4096]obs)
	for i := range recs {
		recs[i] = obs{kinds[rng.IntN(len(kinds))], metrics.Route(rng.IntN(3))}
	}
	return recs
}()

var benchSink uint64

// BenchmarkObserve compares WAL.Observe (an inline fixed array) with the
// map[key]uint64 it replaces, in the same run, per record.
func BenchmarkObserve(b *testing.B) {
	recs := benchRecords
	const mask = len(benchRecords) - 1
	b.Run("array", func(b *testing.B) {
		b.ReportAllocs()
		var w metrics.WAL
		for i := range b.N {
			r := recs[i&mask]
			w.Observe(r.kind, r.route)
		}
		b.StopTimer()
		w.Publish()
		benchSink = uint64(len(w.Snapshot()))
	})
	b.Run("map", func(b *testing.B) {
		type key struct {
			kind  byte
			route metrics.Route
		}
		b.ReportAllocs()
		m := map[key]uint64{}
		for _, r := range recs { // every key present: the steady state
			m[key{byte(r.kind), r.route}] = 0
		}
		b.ResetTimer()
		for i := range b.N {
			r := recs[i&mask]
			m[key{byte(r.kind), r.route}]++
		}
		b.StopTimer()
		benchSink = uint64(len(m))
	})
}
