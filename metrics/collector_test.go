package metrics_test

import (
	"strings"
	"sync"
	"testing"

	"github.com/fanwire/fanwire/metrics"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

const walHelp = "# HELP fanwire_wal_messages_total pgoutput messages received, by message kind and by what the ingest did with them (publish: produced events; state: only updated ingest state; skip: in no projection).\n" +
	"# TYPE fanwire_wal_messages_total counter\n"

func TestCollector(t *testing.T) {
	var w metrics.WAL
	for range 3 {
		w.Observe(metrics.KindBegin, metrics.RouteState)
		w.Observe(metrics.KindInsert, metrics.RoutePublish)
		w.Observe(metrics.KindCommit, metrics.RouteState)
	}
	w.Observe(metrics.KindInsert, metrics.RouteSkip)
	w.Observe(metrics.KindStreamStart, metrics.RouteState)
	w.Observe('X', metrics.RouteSkip)
	w.Publish()

	c := metrics.NewCollector(&w)
	want := walHelp + `fanwire_wal_messages_total{kind="begin",route="state"} 3
fanwire_wal_messages_total{kind="commit",route="state"} 3
fanwire_wal_messages_total{kind="insert",route="publish"} 3
fanwire_wal_messages_total{kind="insert",route="skip"} 1
fanwire_wal_messages_total{kind="stream_start",route="state"} 1
fanwire_wal_messages_total{kind="unknown",route="skip"} 1
`
	for scrape := range 2 { // a scrape must not reset or change a counter
		if err := testutil.CollectAndCompare(c, strings.NewReader(want)); err != nil {
			t.Errorf("scrape %d: %v", scrape+1, err)
		}
	}
	if problems, err := testutil.CollectAndLint(c); err != nil || len(problems) > 0 {
		t.Errorf("lint: %v %v", problems, err)
	}

	// Through a registry, as /metrics serves it: two gathers, same values.
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	first := gatherWAL(t, reg)
	second := gatherWAL(t, reg)
	if len(first) != 6 || !mapsEqual(first, second) {
		t.Errorf("gathers differ or miss series:\n%v\n%v", first, second)
	}
}

func TestCollectorEmpty(t *testing.T) {
	var w metrics.WAL
	if n := testutil.CollectAndCount(metrics.NewCollector(&w)); n != 0 {
		t.Errorf("an empty WAL exports %d series, want 0", n)
	}
}

// TestCollectorConcurrentScrape scrapes through a registry while the owner
// observes (run with -race): values only ever grow.
func TestCollectorConcurrentScrape(t *testing.T) {
	var w metrics.WAL
	reg := prometheus.NewRegistry()
	reg.MustRegister(metrics.NewCollector(&w))
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer close(done)
		for i := range 50000 {
			w.Observe(metrics.KindUpdate, metrics.Route(i%3))
			if i%16 == 15 {
				w.Publish()
			}
		}
		w.Publish()
	}()
	last := map[string]float64{}
	for stop := false; !stop; {
		select {
		case <-done:
			stop = true
		default:
		}
		for k, v := range gatherWAL(t, reg) {
			if v < last[k] {
				t.Fatalf("%s went from %v to %v", k, last[k], v)
			}
			last[k] = v
		}
	}
	wg.Wait()
	var total float64
	for _, v := range last {
		total += v
	}
	if total != 50000 {
		t.Errorf("final scrape totals %v, want 50000", total)
	}
}

// gatherWAL returns fanwire_wal_messages_total by "kind/route".
func gatherWAL(t *testing.T, g prometheus.Gatherer) map[string]float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatalf("Gather: %v", err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "fanwire_wal_messages_total" || mf.GetType().String() != "COUNTER" {
			continue
		}
		for _, m := range mf.GetMetric() {
			var key []string
			for _, l := range m.GetLabel() {
				key = append(key, l.GetValue())
			}
			out[strings.Join(key, "/")] = m.GetCounter().GetValue()
		}
	}
	return out
}

func mapsEqual(a, b map[string]float64) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if bv, ok := b[k]; !ok || bv != v {
			return false
		}
	}
	return true
}
