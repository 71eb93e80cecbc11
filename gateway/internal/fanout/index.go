package fanout

import (
	"slices"
	"sync"

	"github.com/fanwire/fanwire/gateway/internal/trie"
)

// index is the subscription index: a token trie in NATS subject syntax. Each
// trie node where patterns end keeps its subscriptions already grouped per
// client, with each client's subscription ids pre-encoded as a JSON array, so
// matching an event returns ready-made deliveries.
//
// The result is cached per trie node rather than per subject: high-cardinality
// subjects (db.orders.<id>) all land on the same few nodes, so a per-subject
// cache would miss on nearly every event and grow without bound, while the
// node lists are exact and change only where a subscription changed. A subject
// that reaches several nodes (orders.* and orders.42) needs the lists merged;
// the dispatcher caches merges per node set, each valid until one of its
// nodes changes (see matcher).
//
// Concurrency: mutations take mu; the dispatcher holds mu.RLock for a whole
// batch of events, so a subscribe waits at most one batch and a batch waits at
// most one (microsecond) mutation.
type index struct {
	mu   sync.RWMutex
	root *node  // guarded by mu
	gen  uint64 // guarded by mu; incremented by every mutation (a node's ver takes its value)
	size int    // guarded by mu; number of subscriptions

	vroot *vnode // guarded by mu: the filtered subscriptions (view.go)
	vsize int    // guarded by mu
}

// node is a node of the subscription index.
type node = trie.Node[nodeSubs]

// nodeSubs is what an index node holds: the subscriptions whose pattern
// ends there, grouped per client.
type nodeSubs struct {
	deliveries []delivery           // the match result for this node
	byClient   map[*Client]*nodeIDs // client → its ids here and its slot in deliveries
	// ver is the index's gen at the last change of this node's
	// subscriptions (including its pruning): merges cached with another
	// ver are stale (see matcher).
	ver uint64
}

type nodeIDs struct {
	ids []string
	pos int
}

// delivery is one client's share of a matched event. subsLen caches
// len(subs.b) so that queueing a delivery (which needs its size) does not
// touch the subs list itself: one cache miss less per delivery.
type delivery struct {
	c       *Client
	subs    *SubsList
	subsLen int
}

func (d *delivery) setSubs(l *SubsList) {
	d.subs, d.subsLen = l, l.Size
}

func newIndex() *index {
	return &index{root: &node{}}
}

// addThen registers client c's subscription id on pattern, then runs then
// (if not nil) before releasing the index (Hub.Subscribe). The caller has
// checked that id is new for c and that pattern is valid.
func (ix *index) addThen(c *Client, id, pattern string, then func()) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	ix.addLocked(c, id, pattern)
	if then != nil {
		then()
	}
}

// addLocked adds; ix.mu is held for writing.
func (ix *index) addLocked(c *Client, id, pattern string) {
	n := ix.root.Walk(pattern)
	v := &n.Val
	if v.byClient == nil {
		v.byClient = make(map[*Client]*nodeIDs)
	}
	e := v.byClient[c]
	if e == nil {
		e = &nodeIDs{pos: len(v.deliveries)}
		v.byClient[c] = e
		v.deliveries = append(v.deliveries, delivery{c: c})
	}
	e.ids = append(e.ids, id)
	slices.Sort(e.ids)
	v.deliveries[e.pos].setSubs(c.SubsFor(e.ids))
	ix.gen++
	v.ver = ix.gen
	n.N++
	ix.size++
}

// removeThen unregisters client c's subscription id on pattern, then runs
// then (if not nil) before releasing the index, like addThen; it reports
// whether the subscription was there.
func (ix *index) removeThen(c *Client, id, pattern string, then func()) bool {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	if then != nil {
		defer then()
	}
	n := ix.root.Find(pattern)
	if n == nil {
		return false
	}
	v := &n.Val
	e := v.byClient[c]
	if e == nil {
		return false
	}
	i := slices.Index(e.ids, id)
	if i < 0 {
		return false
	}
	e.ids = slices.Delete(e.ids, i, i+1)
	ix.gen++
	v.ver = ix.gen
	n.N--
	ix.size--
	if len(e.ids) > 0 {
		v.deliveries[e.pos].setSubs(c.SubsFor(e.ids))
		return true
	}
	delete(v.byClient, c)
	last := len(v.deliveries) - 1
	if e.pos != last {
		moved := v.deliveries[last]
		v.deliveries[e.pos] = moved
		v.byClient[moved.c].pos = e.pos
	}
	v.deliveries[last] = delivery{}
	v.deliveries = v.deliveries[:last]
	n.Prune()
	return true
}
