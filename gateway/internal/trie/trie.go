package trie

import "github.com/fanwire/fanwire/subject"

// Node is a node of a trie; its zero value is an empty root.
type Node[V any] struct {
	Val V   // what the owner files under the node's pattern
	N   int // subscriptions ending here, which the owner keeps: Prune and Collect read it

	parent *Node[V] // nil for the root
	token  string   // the token leading here from parent ("*" and ">" included)
	next   map[string]*Node[V]
	star   *Node[V] // the child for '*'
	gt     *Node[V] // the child for '>' (always a leaf)
}

// Walk returns pattern's node, made with its parents where missing.
func (n *Node[V]) Walk(pattern string) *Node[V] {
	for rest, more := pattern, true; more; {
		var tok string
		tok, rest, more = subject.Next(rest)
		n = n.child(tok)
	}
	return n
}

// Find returns pattern's node, or nil when no pattern filed goes through
// it (Walk made none).
func (n *Node[V]) Find(pattern string) *Node[V] {
	for rest, more := pattern, true; more && n != nil; {
		var tok string
		tok, rest, more = subject.Next(rest)
		n = n.lookup(tok)
	}
	return n
}

func (n *Node[V]) child(tok string) *Node[V] {
	switch tok {
	case "*":
		if n.star == nil {
			n.star = &Node[V]{parent: n, token: tok}
		}
		return n.star
	case ">":
		if n.gt == nil {
			n.gt = &Node[V]{parent: n, token: tok}
		}
		return n.gt
	}
	c := n.next[tok]
	if c == nil {
		if n.next == nil {
			n.next = make(map[string]*Node[V])
		}
		c = &Node[V]{parent: n, token: tok}
		n.next[tok] = c
	}
	return c
}

func (n *Node[V]) lookup(tok string) *Node[V] {
	switch tok {
	case "*":
		return n.star
	case ">":
		return n.gt
	}
	return n.next[tok]
}

// Prune removes empty nodes (N zero, no child) from n up towards the
// root.
func (n *Node[V]) Prune() {
	for n.parent != nil && n.N == 0 && len(n.next) == 0 && n.star == nil && n.gt == nil {
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

// Collect appends to out every node with subscriptions (N > 0) whose
// pattern matches subj. literalFirst leaves out n's own wildcard children
// (n is the root, subj a system subject: only patterns that write its
// first token out). It allocates only if out must grow.
func (n *Node[V]) Collect(subj string, out []*Node[V], literalFirst bool) []*Node[V] {
	tok, rest, more := subject.Next(subj)
	if !literalFirst && n.gt != nil && n.gt.N > 0 {
		out = append(out, n.gt)
	}
	if c := n.next[tok]; c != nil {
		if more {
			out = c.Collect(rest, out, false)
		} else if c.N > 0 {
			out = append(out, c)
		}
	}
	if c := n.star; c != nil && !literalFirst {
		if more {
			out = c.Collect(rest, out, false)
		} else if c.N > 0 {
			out = append(out, c)
		}
	}
	return out
}

// Size is the number of nodes below n: zero once every pattern is gone
// and pruned, or the owner leaks nodes.
func (n *Node[V]) Size() int {
	c := 0
	for _, ch := range n.next {
		c += 1 + ch.Size()
	}
	if n.star != nil {
		c += 1 + n.star.Size()
	}
	if n.gt != nil {
		c += 1 + n.gt.Size()
	}
	return c
}
