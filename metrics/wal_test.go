package metrics_test

import (
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/fanwire/fanwire/metrics"
)

type obs struct {
	kind  metrics.Kind
	route metrics.Route
}

func TestSnapshot(t *testing.T) {
	for _, tc := range []struct {
		name string
		obs  []obs
		want []metrics.Cell
	}{
		{name: "empty", obs: nil, want: nil},
		{
			name: "one transaction",
			obs: []obs{
				{'B', metrics.RouteState}, {'R', metrics.RouteState}, {'I', metrics.RoutePublish},
				{'I', metrics.RoutePublish}, {'U', metrics.RouteSkip}, {'C', metrics.RouteState},
			},
			want: []metrics.Cell{
				{Kind: metrics.KindBegin, Route: metrics.RouteState, Messages: 1},
				{Kind: metrics.KindCommit, Route: metrics.RouteState, Messages: 1},
				{Kind: metrics.KindInsert, Route: metrics.RoutePublish, Messages: 2},
				{Kind: metrics.KindRelation, Route: metrics.RouteState, Messages: 1},
				{Kind: metrics.KindUpdate, Route: metrics.RouteSkip, Messages: 1},
			},
		},
		{
			name: "routes sort by name within a kind",
			obs:  []obs{{'D', metrics.RouteState}, {'D', metrics.RouteSkip}, {'D', metrics.RoutePublish}, {'D', metrics.RoutePublish}},
			want: []metrics.Cell{
				{Kind: metrics.KindDelete, Route: metrics.RoutePublish, Messages: 2},
				{Kind: metrics.KindDelete, Route: metrics.RouteSkip, Messages: 1},
				{Kind: metrics.KindDelete, Route: metrics.RouteState, Messages: 1},
			},
		},
		{
			name: "unknown bytes share one row",
			obs:  []obs{{'X', metrics.RouteSkip}, {0, metrics.RouteSkip}, {0xff, metrics.RouteSkip}, {'k', metrics.RouteState}},
			want: []metrics.Cell{
				{Kind: 0, Route: metrics.RouteSkip, Messages: 3},
				{Kind: 0, Route: metrics.RouteState, Messages: 1},
			},
		},
		{
			name: "v2 stream and two-phase kinds",
			obs: []obs{
				{'S', metrics.RouteState}, {'E', metrics.RouteState}, {'c', metrics.RouteState}, {'A', metrics.RouteState},
				{'b', metrics.RouteState}, {'P', metrics.RouteState}, {'K', metrics.RouteState}, {'r', metrics.RouteState}, {'p', metrics.RouteState},
			},
			want: []metrics.Cell{
				{Kind: metrics.KindBeginPrepare, Route: metrics.RouteState, Messages: 1},
				{Kind: metrics.KindCommitPrepared, Route: metrics.RouteState, Messages: 1},
				{Kind: metrics.KindPrepare, Route: metrics.RouteState, Messages: 1},
				{Kind: metrics.KindRollbackPrepared, Route: metrics.RouteState, Messages: 1},
				{Kind: metrics.KindStreamAbort, Route: metrics.RouteState, Messages: 1},
				{Kind: metrics.KindStreamCommit, Route: metrics.RouteState, Messages: 1},
				{Kind: metrics.KindStreamPrepare, Route: metrics.RouteState, Messages: 1},
				{Kind: metrics.KindStreamStart, Route: metrics.RouteState, Messages: 1},
				{Kind: metrics.KindStreamStop, Route: metrics.RouteState, Messages: 1},
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var w metrics.WAL
			for _, o := range tc.obs {
				w.Observe(o.kind, o.route)
			}
			w.Publish()
			if got := w.Snapshot(); !slices.Equal(got, tc.want) {
				t.Errorf("Snapshot() =\n%v\nwant\n%v", got, tc.want)
			}
		})
	}
}

// TestSnapshotSortedAll fills every cell in a shuffled order and checks that
// the snapshot lists all of them sorted by (kind name, route name).
func TestSnapshotSortedAll(t *testing.T) {
	kinds := append(metrics.KnownKinds(), 'X')
	routes := []metrics.Route{metrics.RoutePublish, metrics.RouteState, metrics.RouteSkip}
	var all []obs
	for _, k := range kinds {
		for _, r := range routes {
			all = append(all, obs{k, r})
		}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	rng.Shuffle(len(all), func(i, j int) { all[i], all[j] = all[j], all[i] })

	var w metrics.WAL
	for i, o := range all {
		for range i + 1 { // distinct counts, so a swapped cell shows
			w.Observe(o.kind, o.route)
		}
	}
	w.Publish()
	got := w.Snapshot()
	if len(got) != len(all) {
		t.Fatalf("Snapshot() has %d cells, want %d", len(got), len(all))
	}
	if !slices.IsSortedFunc(got, func(a, b metrics.Cell) int {
		return strings.Compare(a.Kind.String()+"/"+a.Route.String(), b.Kind.String()+"/"+b.Route.String())
	}) {
		t.Errorf("Snapshot() not sorted by (kind, route): %v", got)
	}
	for i, o := range all {
		idx := slices.IndexFunc(got, func(c metrics.Cell) bool { return c.Kind.String() == o.kind.String() && c.Route == o.route })
		if idx < 0 || got[idx].Messages != uint64(i+1) {
			t.Errorf("cell %v/%v missing or wrong: %v", o.kind, o.route, got)
		}
	}
}

// TestPublish: observations are invisible until published, and reading
// (twice) changes nothing.
func TestPublish(t *testing.T) {
	var w metrics.WAL
	w.Observe(metrics.KindInsert, metrics.RoutePublish)
	if got := w.Snapshot(); got != nil {
		t.Fatalf("Snapshot() before Publish = %v, want none", got)
	}
	w.Publish()
	w.Observe(metrics.KindInsert, metrics.RoutePublish)
	want := []metrics.Cell{{Kind: metrics.KindInsert, Route: metrics.RoutePublish, Messages: 1}}
	for range 2 {
		if got := w.Snapshot(); !slices.Equal(got, want) {
			t.Fatalf("Snapshot() = %v, want %v", got, want)
		}
	}
	w.Publish()
	w.Publish() // nothing changed: a no-op
	want[0].Messages = 2
	if got := w.Snapshot(); !slices.Equal(got, want) {
		t.Fatalf("Snapshot() = %v, want %v", got, want)
	}
}

func TestKindNames(t *testing.T) {
	kinds := metrics.KnownKinds()
	if len(kinds) != 19 {
		t.Errorf("KnownKinds() has %d kinds, want the 19 of PostgreSQL's LogicalRepMsgType", len(kinds))
	}
	names := map[string]bool{}
	for _, k := range kinds {
		name := k.String()
		if !k.Known() || name == "unknown" || names[name] {
			t.Errorf("kind %q: Known()=%v, name %q (duplicate or unknown)", byte(k), k.Known(), name)
		}
		names[name] = true
	}
	for _, tc := range []struct {
		kind metrics.Kind
		want string
	}{
		{'I', "insert"}, {'S', "stream_start"}, {'c', "stream_commit"}, {'K', "commit_prepared"},
		{'M', "message"}, {'Y', "type"}, {'X', "unknown"}, {0, "unknown"},
	} {
		if got := tc.kind.String(); got != tc.want {
			t.Errorf("Kind(%q).String() = %q, want %q", byte(tc.kind), got, tc.want)
		}
	}
	for r, want := range []string{"publish", "state", "skip", "invalid"} {
		if got := metrics.Route(r).String(); got != want {
			t.Errorf("Route(%d).String() = %q, want %q", r, got, want)
		}
	}
}

func TestObserveAllocs(t *testing.T) {
	var w metrics.WAL
	if n := testing.AllocsPerRun(1000, func() { w.Observe(metrics.KindUpdate, metrics.RoutePublish) }); n != 0 {
		t.Errorf("Observe: %v allocs, want 0", n)
	}
	if n := testing.AllocsPerRun(1000, func() { w.Observe(metrics.KindCommit, metrics.RouteState); w.Publish() }); n != 0 {
		t.Errorf("Publish: %v allocs, want 0", n)
	}
}

// TestConcurrentSnapshot runs the owner and readers at once (run with -race).
// The owner publishes after each commit, so every snapshot must show as many
// begins as commits, and no counter may ever go backwards.
func TestConcurrentSnapshot(t *testing.T) {
	const txns = 20000
	var w metrics.WAL
	var wg sync.WaitGroup
	done := make(chan struct{})
	wg.Add(1)
	go func() { // the owner
		defer wg.Done()
		defer close(done)
		for i := range txns {
			w.Observe(metrics.KindBegin, metrics.RouteState)
			w.Observe(metrics.KindInsert, metrics.Route(i%3))
			w.Observe(metrics.KindCommit, metrics.RouteState)
			w.Publish()
		}
	}()
	errs := make(chan string, 2)
	for range 2 {
		wg.Add(1)
		go func() { // a reader
			defer wg.Done()
			last := map[string]uint64{}
			for stop := false; !stop; {
				select {
				case <-done:
					stop = true // one more read after the owner's last Publish
				default:
				}
				var begins, commits uint64
				for _, c := range w.Snapshot() {
					key := c.Kind.String() + "/" + c.Route.String()
					if c.Messages < last[key] {
						errs <- key + " went backwards"
						return
					}
					last[key] = c.Messages
					switch c.Kind {
					case metrics.KindBegin:
						begins = c.Messages
					case metrics.KindCommit:
						commits = c.Messages
					}
				}
				if begins != commits {
					errs <- "torn snapshot: begins != commits"
					return
				}
				if stop && commits != txns {
					errs <- "final snapshot misses commits"
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}
