package fanout

import (
	"slices"

	"github.com/fanwire/fanwire/subject"
)

// matcher turns a subject into deliveries. It is owned by the dispatcher (one
// goroutine), which is why its merge cache needs no lock. A cached merge
// records the version of each of its nodes (nodeSubs.ver, bumped by every change
// of that node's subscriptions, under the index's write lock) and is used
// only while they all still hold: a subscribe or unsubscribe invalidates
// just the merges of the node it changed, not the whole cache, so
// connections coming and going elsewhere on the node do not make the
// dispatcher merge again (and allocate a map and a list per client).
type matcher struct {
	scratch []*node
	merged  map[mergeKey]mergeEntry
	// sweptGen is the index's gen at the last sweep of stale entries.
	sweptGen uint64
}

// mergeKey identifies a set of up to four matched nodes; a subject reaching
// more nodes than that is merged without caching (rare: it takes four
// distinct patterns that all match one subject).
type mergeKey [4]*node

// mergeEntry is a cached merge and the versions of its nodes when it was
// merged.
type mergeEntry struct {
	vers [4]uint64
	d    []delivery
}

// maxMerged bounds the merge cache; it is cleared when full.
const maxMerged = 4096

// match returns the deliveries for subject. The caller holds ix.mu (read).
// The result is shared: the caller must not modify it. With a warm cache it
// allocates nothing.
func (m *matcher) match(ix *index, subj string) []delivery {
	if ix.gen-m.sweptGen > uint64(len(m.merged))+64 {
		m.sweep(ix.gen)
	}
	// A system subject: only patterns that write its first token out.
	m.scratch = ix.root.Collect(subj, m.scratch[:0], subject.IsSystem(subj))
	switch len(m.scratch) {
	case 0:
		return nil
	case 1:
		return m.scratch[0].Val.deliveries
	}
	var key mergeKey
	cacheable := len(m.scratch) <= len(key)
	if !cacheable {
		return mergeDeliveries(m.scratch)
	}
	copy(key[:], m.scratch)
	if e, ok := m.merged[key]; ok && e.current(&key) {
		return e.d
	}
	e := mergeEntry{d: mergeDeliveries(m.scratch)}
	for i, n := range m.scratch {
		e.vers[i] = n.Val.ver
	}
	if m.merged == nil || len(m.merged) >= maxMerged {
		m.merged = make(map[mergeKey]mergeEntry)
	}
	m.merged[key] = e
	return e.d
}

// current reports whether none of the entry's nodes changed since it was
// merged (the caller holds the index).
func (e *mergeEntry) current(key *mergeKey) bool {
	for i, n := range key {
		if n == nil {
			break
		}
		if n.Val.ver != e.vers[i] {
			return false
		}
	}
	return true
}

// sweep drops the entries that can no longer be used: a node of theirs
// changed, or was pruned (which changes it first). Otherwise an entry whose
// node set is never matched again would keep its clients (closed
// connections among them) until the cache fills. It runs once the index
// has changed more times than the cache holds entries, so its cost per
// change is constant.
func (m *matcher) sweep(gen uint64) {
	for k, e := range m.merged {
		if !e.current(&k) {
			delete(m.merged, k)
		}
	}
	m.sweptGen = gen
}

// mergeDeliveries combines the per-node lists so that each client appears
// once, listing every one of its subscriptions that matched.
func mergeDeliveries(nodes []*node) []delivery {
	ids := make(map[*Client][]string)
	var order []*Client
	for _, n := range nodes {
		for c, e := range n.Val.byClient {
			if _, seen := ids[c]; !seen {
				order = append(order, c)
			}
			ids[c] = append(ids[c], e.ids...)
		}
	}
	out := make([]delivery, 0, len(order))
	for _, c := range order {
		l := ids[c]
		slices.Sort(l)
		d := delivery{c: c}
		d.setSubs(c.SubsFor(l))
		out = append(out, d)
	}
	return out
}
