package gateway

import "github.com/fanwire/fanwire/subject"

// trieNode is a node of a subject-pattern trie: each level is a pattern's
// token, with children by literal token, '*' and '>'. The subscription
// index (fanout_index.go) and the view index (fanout_view.go) are one each; val is what
// a node holds for its owner, and n how many subscriptions end at it,
// which the owner keeps and prune and collect read. The owner's lock
// guards every node.
type trieNode[V any] struct {
	parent *trieNode[V] // nil for the root
	token  string       // the token leading here from parent ("*" and ">" included)
	next   map[string]*trieNode[V]
	star   *trieNode[V] // the child for '*'
	gt     *trieNode[V] // the child for '>' (always a leaf)
	n      int          // subscriptions ending here
	val    V
}

// walk returns pattern's node, made with its parents where missing.
func (n *trieNode[V]) walk(pattern string) *trieNode[V] {
	for rest, more := pattern, true; more; {
		var tok string
		tok, rest, more = subject.Next(rest)
		n = n.child(tok)
	}
	return n
}

// find returns pattern's node, or nil.
func (n *trieNode[V]) find(pattern string) *trieNode[V] {
	for rest, more := pattern, true; more && n != nil; {
		var tok string
		tok, rest, more = subject.Next(rest)
		n = n.lookup(tok)
	}
	return n
}

func (n *trieNode[V]) child(tok string) *trieNode[V] {
	switch tok {
	case "*":
		if n.star == nil {
			n.star = &trieNode[V]{parent: n, token: tok}
		}
		return n.star
	case ">":
		if n.gt == nil {
			n.gt = &trieNode[V]{parent: n, token: tok}
		}
		return n.gt
	}
	c := n.next[tok]
	if c == nil {
		if n.next == nil {
			n.next = make(map[string]*trieNode[V])
		}
		c = &trieNode[V]{parent: n, token: tok}
		n.next[tok] = c
	}
	return c
}

func (n *trieNode[V]) lookup(tok string) *trieNode[V] {
	switch tok {
	case "*":
		return n.star
	case ">":
		return n.gt
	}
	return n.next[tok]
}

// prune removes empty nodes (no subscription, no child) from n up towards
// the root.
func (n *trieNode[V]) prune() {
	for n.parent != nil && n.n == 0 && len(n.next) == 0 && n.star == nil && n.gt == nil {
		p := n.parent
		switch n.token {
		case "*":
			p.star = nil
		case ">":
			p.gt = nil
		default:
			delete(p.next, n.token)
		}
		n = p
	}
}

// collect appends to out every node with subscriptions whose pattern
// matches subj. literalFirst leaves out n's own wildcard children (n is the
// root, subj a system subject: only patterns that write its first token
// out). It allocates only if out must grow.
func (n *trieNode[V]) collect(subj string, out []*trieNode[V], literalFirst bool) []*trieNode[V] {
	tok, rest, more := subject.Next(subj)
	if !literalFirst && n.gt != nil && n.gt.n > 0 {
		out = append(out, n.gt)
	}
	if c := n.next[tok]; c != nil {
		if more {
			out = c.collect(rest, out, false)
		} else if c.n > 0 {
			out = append(out, c)
		}
	}
	if c := n.star; c != nil && !literalFirst {
		if more {
			out = c.collect(rest, out, false)
		} else if c.n > 0 {
			out = append(out, c)
		}
	}
	return out
}
