package fanout

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fanwire/fanwire/subject"
)

func testClient() *Client {
	return NewClient(1<<20, 1<<30, func() { panic("unexpected overflow") })
}

// matchResult is a match as a map from client to its encoded subs list.
type matchResult map[*Client]string

func matchNow(t testing.TB, ix *index, m *matcher, subject string) matchResult {
	t.Helper()
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	out := make(matchResult)
	for _, d := range m.match(ix, subject) {
		if _, dup := out[d.c]; dup {
			t.Fatalf("match(%q) lists a client twice", subject)
		}
		if d.subs == nil {
			t.Fatalf("match(%q): delivery without a subs list", subject)
		}
		out[d.c] = string(d.subs.B)
	}
	return out
}

func checkMatch(t testing.TB, ix *index, m *matcher, subject string, want matchResult) {
	t.Helper()
	if got := matchNow(t, ix, m, subject); !maps.Equal(got, want) {
		t.Errorf("match(%q) = %s, want %s", subject, describe(got), describe(want))
	}
}

var clientNames = map[*Client]string{}

func describe(r matchResult) string {
	var parts []string
	for c, s := range r {
		name := clientNames[c]
		if name == "" {
			name = fmt.Sprintf("%p", c)
		}
		parts = append(parts, name+":"+s)
	}
	slices.Sort(parts)
	return "{" + strings.Join(parts, " ") + "}"
}

func TestIndexGroupsPerClient(t *testing.T) {
	ix, m := newIndex(), &matcher{}
	c1, c2 := testClient(), testClient()
	ix.add(c1, "s3", "a.b")
	ix.add(c1, "s1", "a.b")
	ix.add(c2, "x", "a.b")
	ix.add(c1, "s10", "a.b")
	ix.add(c1, "s2", "a.b")
	checkMatch(t, ix, m, "a.b", matchResult{c1: `["s1","s10","s2","s3"]`, c2: `["x"]`})
	checkMatch(t, ix, m, "a.c", matchResult{})
	checkMatch(t, ix, m, "a", matchResult{})
	checkMatch(t, ix, m, "a.b.c", matchResult{})
	if n := ix.len(); n != 5 {
		t.Errorf("len = %d, want 5", n)
	}
}

func TestIndexMergesNodes(t *testing.T) {
	ix, m := newIndex(), &matcher{}
	c1, c2, c3 := testClient(), testClient(), testClient()
	ix.add(c1, "s1", "a.*")
	ix.add(c1, "s2", "a.b")
	ix.add(c1, "s4", "a.>")
	ix.add(c2, "x", ">")
	ix.add(c3, "y", "a.b")
	for range 2 { // cold, then from the merge cache
		checkMatch(t, ix, m, "a.b", matchResult{c1: `["s1","s2","s4"]`, c2: `["x"]`, c3: `["y"]`})
		checkMatch(t, ix, m, "a.c", matchResult{c1: `["s1","s4"]`, c2: `["x"]`})
		checkMatch(t, ix, m, "a.b.c", matchResult{c1: `["s4"]`, c2: `["x"]`})
		checkMatch(t, ix, m, "a", matchResult{c2: `["x"]`})
		checkMatch(t, ix, m, "b.b", matchResult{c2: `["x"]`})
	}
	// Five nodes reach a.b: more than a merge key holds, merged uncached.
	ix.add(c3, "z", "*.b")
	for range 2 {
		checkMatch(t, ix, m, "a.b", matchResult{c1: `["s1","s2","s4"]`, c2: `["x"]`, c3: `["y","z"]`})
		checkMatch(t, ix, m, "c.b", matchResult{c2: `["x"]`, c3: `["z"]`})
	}
}

func TestIndexRemove(t *testing.T) {
	ix, m := newIndex(), &matcher{}
	c1, c2 := testClient(), testClient()
	subjects := []string{"a", "b", "a.b", "a.c", "b.b", "a.b.c", "a.b.c.d"}
	subs := []struct {
		c           *Client
		id, pattern string
	}{
		{c1, "s1", "a.b"},
		{c1, "s2", "a.*"},
		{c2, "x", "a.b"},
		{c1, "s3", "a.b"},
		{c2, "y", ">"},
		{c1, "s4", "a.>"},
		{c2, "z", "a.b.c.d"},
		{c1, "s5", "*.*.*"},
	}
	snap := func() map[string]matchResult {
		out := map[string]matchResult{}
		for _, s := range subjects {
			out[s] = matchNow(t, ix, m, s)
		}
		return out
	}
	var before []map[string]matchResult
	for _, s := range subs {
		before = append(before, snap())
		ix.add(s.c, s.id, s.pattern)
	}
	full := snap()

	// Removing what is not there changes nothing.
	for _, bad := range []struct {
		c           *Client
		id, pattern string
	}{
		{c1, "nope", "a.b"},     // unknown id
		{c1, "s1", "a.c"},       // pattern without a node
		{c1, "s1", "a.b.c"},     // node exists as a path only
		{c2, "s1", "a.b"},       // another client's id
		{c1, "s1", "x.y.z.w.v"}, // no such path at all
		{c1, "s2", "a.>"},       // right id, wrong pattern
	} {
		if ix.remove(bad.c, bad.id, bad.pattern) {
			t.Errorf("remove(%q, %q) = true for a subscription that is not there", bad.id, bad.pattern)
		}
	}
	if got := snap(); !equalSnaps(got, full) {
		t.Fatalf("failed removals changed the index")
	}

	// Removing in reverse order restores every earlier state.
	for i := len(subs) - 1; i >= 0; i-- {
		s := subs[i]
		if !ix.remove(s.c, s.id, s.pattern) {
			t.Fatalf("remove(%q, %q) = false", s.id, s.pattern)
		}
		if ix.remove(s.c, s.id, s.pattern) {
			t.Fatalf("second remove(%q, %q) = true", s.id, s.pattern)
		}
		if got := snap(); !equalSnaps(got, before[i]) {
			t.Fatalf("after removing %s/%s: %v, want %v", s.id, s.pattern, got, before[i])
		}
	}
	if ix.len() != 0 {
		t.Errorf("len = %d after removing everything", ix.len())
	}
	// Every node was pruned.
	if r := ix.root; r.Size() != 0 || r.N != 0 || len(r.Val.deliveries) != 0 {
		t.Errorf("root not empty after removing everything: %d nodes below it, %d subscriptions, %d deliveries", r.Size(), r.N, len(r.Val.deliveries))
	}
	// And the pruned index works as new.
	for _, s := range subs {
		ix.add(s.c, s.id, s.pattern)
	}
	if got := snap(); !equalSnaps(got, full) {
		t.Errorf("re-adding after pruning: %v, want %v", got, full)
	}
}

// TestIndexRemoveKeepsOtherClients removes the first client of a node whose
// delivery list has several, exercising the swap with the last entry.
func TestIndexRemoveKeepsOtherClients(t *testing.T) {
	ix, m := newIndex(), &matcher{}
	cs := []*Client{testClient(), testClient(), testClient(), testClient()}
	for i, c := range cs {
		ix.add(c, fmt.Sprint("s", i), "a.b")
		ix.add(c, fmt.Sprint("t", i), "a.b")
	}
	ix.remove(cs[0], "s0", "a.b")
	ix.remove(cs[0], "t0", "a.b") // cs[0] gone: cs[3] moves into its slot
	ix.remove(cs[3], "s3", "a.b") // the moved entry's position was updated
	ix.remove(cs[1], "t1", "a.b")
	checkMatch(t, ix, m, "a.b", matchResult{cs[1]: `["s1"]`, cs[2]: `["s2","t2"]`, cs[3]: `["t3"]`})
	ix.remove(cs[3], "t3", "a.b")
	ix.add(cs[0], "u", "a.b")
	checkMatch(t, ix, m, "a.b", matchResult{cs[0]: `["u"]`, cs[1]: `["s1"]`, cs[2]: `["s2","t2"]`})
}

// takeAll empties c's mailbox as its writer would and returns the items.
func takeAll(c *Client) []Item {
	b := c.Mailbox.Take()
	defer b.Release()
	var out []Item
	for s := b.First(); s != nil; s = b.Next(s) {
		out = append(out, b.Used(s)...)
	}
	return out
}

func equalSnaps(a, b map[string]matchResult) bool {
	return maps.EqualFunc(a, b, func(x, y matchResult) bool { return maps.Equal(x, y) })
}

func TestIndexManyClients(t *testing.T) {
	ix, m := newIndex(), &matcher{}
	cs := make([]*Client, 1000)
	for i := range cs {
		cs[i] = testClient()
		ix.add(cs[i], "s", "orders.*")
	}
	want := matchResult{}
	for _, c := range cs {
		want[c] = `["s"]`
	}
	checkMatch(t, ix, m, "orders.42", want)
	for i := 0; i < len(cs); i += 2 {
		ix.remove(cs[i], "s", "orders.*")
		delete(want, cs[i])
	}
	checkMatch(t, ix, m, "orders.42", want)
	if n := len(matchNow(t, ix, m, "orders.42")); n != 500 {
		t.Errorf("%d deliveries, want 500", n)
	}
}

// TestIndexMatchCacheInvalidation: the matcher caches merged results per
// node set and must drop them whenever the index changes.
func TestIndexMatchCacheInvalidation(t *testing.T) {
	ix, m := newIndex(), &matcher{}
	c1, c2 := testClient(), testClient()
	ix.add(c1, "s1", "a.*")
	ix.add(c1, "s2", "a.b")
	checkMatch(t, ix, m, "a.b", matchResult{c1: `["s1","s2"]`}) // cached now
	if len(m.merged) != 1 {
		t.Fatalf("merge cache holds %d entries, want 1", len(m.merged))
	}

	ix.add(c2, "x", "a.b") // a new client on a merged node
	checkMatch(t, ix, m, "a.b", matchResult{c1: `["s1","s2"]`, c2: `["x"]`})
	ix.add(c1, "s0", "a.*") // a new id for a client already there
	checkMatch(t, ix, m, "a.b", matchResult{c1: `["s0","s1","s2"]`, c2: `["x"]`})
	ix.remove(c1, "s1", "a.*")
	checkMatch(t, ix, m, "a.b", matchResult{c1: `["s0","s2"]`, c2: `["x"]`})
	ix.remove(c2, "x", "a.b")
	checkMatch(t, ix, m, "a.b", matchResult{c1: `["s0","s2"]`})

	// Node sets change too: a node appears, a node disappears.
	ix.add(c2, "y", ">")
	checkMatch(t, ix, m, "a.b", matchResult{c1: `["s0","s2"]`, c2: `["y"]`})
	ix.remove(c1, "s0", "a.*")
	checkMatch(t, ix, m, "a.b", matchResult{c1: `["s2"]`, c2: `["y"]`})
	ix.remove(c2, "y", ">")
	checkMatch(t, ix, m, "a.b", matchResult{c1: `["s2"]`}) // single node again
	ix.remove(c1, "s2", "a.b")
	checkMatch(t, ix, m, "a.b", matchResult{})

	// A node removed and re-created (so a cached key could name a stale
	// node) still matches fresh.
	ix.add(c1, "s1", "a.*")
	ix.add(c2, "x", "a.b")
	checkMatch(t, ix, m, "a.b", matchResult{c1: `["s1"]`, c2: `["x"]`})
	ix.remove(c2, "x", "a.b")
	ix.add(c2, "x2", "a.b")
	checkMatch(t, ix, m, "a.b", matchResult{c1: `["s1"]`, c2: `["x2"]`})
}

// TestIndexMatchCacheKeepsUnrelated: a subscription change invalidates only
// the cached merges of the nodes it changed. Client A's merge changes when A
// subscribes to one of its nodes (or a new node joins its set); it survives,
// not recomputed, when an unrelated client B subscribes or unsubscribes
// elsewhere (connection churn must not make the dispatcher merge again).
func TestIndexMatchCacheKeepsUnrelated(t *testing.T) {
	ix, m := newIndex(), &matcher{}
	a, b := testClient(), testClient()
	clientNames[a], clientNames[b] = "A", "B"
	ix.add(a, "s1", "a.*")
	ix.add(a, "s2", "a.b")
	cached := func() *delivery {
		ix.mu.RLock()
		defer ix.mu.RUnlock()
		return &m.match(ix, "a.b")[0]
	}
	checkMatch(t, ix, m, "a.b", matchResult{a: `["s1","s2"]`})
	first := cached()
	ix.add(b, "x", "x.y") // unrelated node
	ix.add(b, "y", "a.c") // a sibling, not in a.b's set
	if cached() != first {
		t.Errorf("B subscribing elsewhere dropped A's cached merge")
	}
	ix.remove(b, "x", "x.y")
	ix.remove(b, "y", "a.c") // prunes a node
	if cached() != first {
		t.Errorf("B unsubscribing elsewhere dropped A's cached merge")
	}
	checkMatch(t, ix, m, "a.b", matchResult{a: `["s1","s2"]`})

	ix.add(a, "s0", "a.*") // A on a node of the set
	checkMatch(t, ix, m, "a.b", matchResult{a: `["s0","s1","s2"]`})
	ix.add(a, "s3", "a.>") // a node joins the set
	checkMatch(t, ix, m, "a.b", matchResult{a: `["s0","s1","s2","s3"]`})
	ix.add(b, "z", "a.b") // B on a node of the set
	checkMatch(t, ix, m, "a.b", matchResult{a: `["s0","s1","s2","s3"]`, b: `["z"]`})
	second := cached()
	ix.add(b, "w", "c.d")
	if cached() != second {
		t.Errorf("B subscribing elsewhere dropped the cached merge")
	}
	ix.remove(a, "s2", "a.b")
	checkMatch(t, ix, m, "a.b", matchResult{a: `["s0","s1","s3"]`, b: `["z"]`})
	ix.remove(b, "z", "a.b") // a.b's node is pruned: a.* and a.> remain
	checkMatch(t, ix, m, "a.b", matchResult{a: `["s0","s1","s3"]`})
}

// TestIndexAgainstBruteForce applies random subscribes and unsubscribes and
// compares every match (through one long-lived matcher, as the dispatcher
// has) with subject.Match over a model of the subscriptions.
func TestIndexAgainstBruteForce(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	patterns := []string{"a", "b", "*", ">", "a.b", "a.*", "*.b", "*.*", "a.>", "*.>", "a.b.c", "a.*.c", "*.b.>", "a.b.>"}
	subjects := []string{"a", "b", "c", "a.b", "a.c", "b.b", "a.b.c", "a.x.c", "b.b.b", "a.b.c.d"}
	cs := make([]*Client, 5)
	for i := range cs {
		cs[i] = testClient()
		clientNames[cs[i]] = fmt.Sprint("c", i)
	}
	type sub struct {
		c  *Client
		id string
	}
	model := map[sub]string{} // → pattern
	ix, m := newIndex(), &matcher{}
	for step := range 1500 {
		s := sub{cs[rng.IntN(len(cs))], fmt.Sprint("s", rng.IntN(6))}
		if p, ok := model[s]; ok {
			if !ix.remove(s.c, s.id, p) {
				t.Fatalf("step %d: remove(%s, %q) = false", step, s.id, p)
			}
			delete(model, s)
		} else {
			p := patterns[rng.IntN(len(patterns))]
			ix.add(s.c, s.id, p)
			model[s] = p
		}
		if ix.len() != len(model) {
			t.Fatalf("step %d: len %d, model %d", step, ix.len(), len(model))
		}
		for _, subj := range subjects {
			ids := map[*Client][]string{}
			for s, p := range model {
				if subject.Match(p, subj) {
					ids[s.c] = append(ids[s.c], s.id)
				}
			}
			want := matchResult{}
			for c, l := range ids {
				slices.Sort(l)
				want[c] = string(EncodeSubsList(l).B)
			}
			if got := matchNow(t, ix, m, subj); !maps.Equal(got, want) {
				t.Fatalf("step %d: match(%q) = %s, want %s", step, subj, describe(got), describe(want))
			}
		}
	}
}

// TestIndexMatchAllocs guards the dispatcher's hot path: a warm match
// allocates nothing, whether the subject reaches one node or several.
func TestIndexMatchAllocs(t *testing.T) {
	ix, m := newIndex(), &matcher{}
	for i := range 100 {
		c := testClient()
		ix.add(c, "s1", "orders.*")
		if i%3 == 0 {
			ix.add(c, "s2", "orders.42")
		}
		if i%5 == 0 {
			ix.add(c, "s3", ">")
		}
	}
	for _, subject := range []string{
		"orders.7",   // orders.* and >: merged
		"orders.42",  // orders.*, orders.42 and >: merged
		"payments.1", // > alone: one node
		"orders",     // > alone
	} {
		ix.mu.RLock()
		n := len(m.match(ix, subject)) // warm
		allocs := testing.AllocsPerRun(1000, func() {
			if len(m.match(ix, subject)) != n {
				panic("match result changed")
			}
		})
		ix.mu.RUnlock()
		if allocs != 0 {
			t.Errorf("warm match(%q) allocated %v times per run, want 0", subject, allocs)
		}
	}
	// The single-node case without a '>' node in the way.
	ix2, m2 := newIndex(), &matcher{}
	ix2.add(testClient(), "s1", "orders.*")
	ix2.mu.RLock()
	m2.match(ix2, "orders.1")
	if allocs := testing.AllocsPerRun(1000, func() { m2.match(ix2, "orders.1") }); allocs != 0 {
		t.Errorf("warm single-node match allocated %v times per run, want 0", allocs)
	}
	if allocs := testing.AllocsPerRun(1000, func() { m2.match(ix2, "nothing.here") }); allocs != 0 {
		t.Errorf("match without result allocated %v times per run, want 0", allocs)
	}
	ix2.mu.RUnlock()
}

// TestHubDispatch checks that dispatch queues into each mailbox exactly what
// match says, in event order, wakes each receiving writer once, and calls
// onOverflow exactly once for a client whose mailbox is full while the other
// clients still get every event.
func TestHubDispatch(t *testing.T) {
	h := NewHub(HubConfig{})
	overflows := 0
	full := NewClient(1, 1<<20, func() { overflows++ })
	if _, err := full.Mailbox.PushControl(Item{Ev: NewControl([]byte(`{"type":"pong"}`))}); err != nil {
		t.Fatal(err)
	}
	c1, c2, idle := testClient(), testClient(), testClient()
	clientNames[full], clientNames[c1], clientNames[c2], clientNames[idle] = "full", "c1", "c2", "idle"
	h.idx.add(c1, "s1", "orders.*")
	h.idx.add(c1, "s2", "orders.42")
	h.idx.add(c2, "x", ">")
	h.idx.add(full, "f", "orders.>")
	h.idx.add(idle, "i", "payments.*")

	var evs []*Event
	for _, subj := range []string{"orders.42", "orders.7", "users.1", "orders.42.items", "orders.42"} {
		ev, err := NewEvent(subj, "", []byte(`{}`))
		if err != nil {
			t.Fatal(err)
		}
		evs = append(evs, ev)
	}
	h.Dispatch(evs[:2], "", time.Time{})
	h.Dispatch(evs[2:], "", time.Now())

	if overflows != 1 {
		t.Errorf("onOverflow called %d times, want exactly 1", overflows)
	}
	if !full.Overflowed.Load() {
		t.Error("full client not marked overflowed")
	}
	if got := takeAll(full); len(got) != 1 || got[0].Subs != nil {
		t.Errorf("full client's mailbox holds %d items, want only the reply queued before", len(got))
	}

	// What an independent matcher says each client should have received.
	want := map[*Client][]string{}
	var m matcher
	for _, ev := range evs {
		h.idx.mu.RLock()
		for _, d := range m.match(h.idx, ev.Subject) {
			if d.c != full {
				want[d.c] = append(want[d.c], ev.Subject+" "+string(d.subs.B))
			}
		}
		h.idx.mu.RUnlock()
	}
	if len(want[c1]) != 3 || len(want[c2]) != 5 {
		t.Fatalf("test setup: want %v", want)
	}
	for _, c := range []*Client{c1, c2, idle} {
		var got []string
		for _, it := range takeAll(c) {
			if it.Subs == nil {
				t.Errorf("%s: control item in the mailbox", clientNames[c])
				continue
			}
			if !slices.Contains(evs, it.Ev) {
				t.Errorf("%s: mailbox holds an event that was not dispatched", clientNames[c])
			}
			got = append(got, it.Ev.Subject+" "+string(it.Subs.B))
		}
		if !slices.Equal(got, want[c]) {
			t.Errorf("%s received %q, want %q", clientNames[c], got, want[c])
		}
		wantWake := len(want[c]) > 0
		if woken := len(c.Wake) == 1; woken != wantWake {
			t.Errorf("%s woken %v, want %v", clientNames[c], woken, wantWake)
		}
	}

	// Later dispatches to the overflowed client do not call onOverflow again.
	h.Dispatch(evs, "", time.Time{})
	if overflows != 1 {
		t.Errorf("onOverflow called %d times after another dispatch, want 1", overflows)
	}
	if n := c2.Mailbox.Len(); n != len(evs) {
		t.Errorf("c2 got %d events in the third dispatch, want %d", n, len(evs))
	}
}

// add, remove and len are the index's operations without a then, as the
// tests use them.
func (ix *index) add(c *Client, id, pattern string) { ix.addThen(c, id, pattern, nil) }

func (ix *index) remove(c *Client, id, pattern string) bool {
	return ix.removeThen(c, id, pattern, nil)
}

func (ix *index) len() int {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	return ix.size
}
