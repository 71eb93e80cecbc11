package gateway

import "slices"

// matcher turns a subject into deliveries. It is owned by the dispatcher (one
// goroutine), which is why its merge cache needs no lock: mutations of the
// index bump index.gen, and the matcher drops its cache when it sees a new gen.
type matcher struct {
	gen     uint64
	scratch []*node
	merged  map[mergeKey][]delivery
}

// mergeKey identifies a set of up to four matched nodes; a subject reaching
// more nodes than that is merged without caching (rare: it takes four
// distinct patterns that all match one subject).
type mergeKey [4]*node

// maxMerged bounds the merge cache; it is cleared when full.
const maxMerged = 4096

// match returns the deliveries for subject. The caller holds ix.mu (read).
// The result is shared: the caller must not modify it. With a warm cache it
// allocates nothing.
func (m *matcher) match(ix *index, subject string) []delivery {
	if m.gen != ix.gen {
		clear(m.merged)
		m.gen = ix.gen
	}
	m.scratch = ix.root.collect(subject, m.scratch[:0])
	switch len(m.scratch) {
	case 0:
		return nil
	case 1:
		return m.scratch[0].deliveries
	}
	var key mergeKey
	cacheable := len(m.scratch) <= len(key)
	if cacheable {
		copy(key[:], m.scratch)
		if d, ok := m.merged[key]; ok {
			return d
		}
	}
	d := mergeDeliveries(m.scratch)
	if cacheable {
		if m.merged == nil || len(m.merged) >= maxMerged {
			m.merged = make(map[mergeKey][]delivery)
		}
		m.merged[key] = d
	}
	return d
}

// mergeDeliveries combines the per-node lists so that each client appears
// once, listing every one of its subscriptions that matched.
func mergeDeliveries(nodes []*node) []delivery {
	ids := make(map[*client][]string)
	var order []*client
	for _, n := range nodes {
		for c, e := range n.byClient {
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
		d.setSubs(c.subsFor(l))
		out = append(out, d)
	}
	return out
}
