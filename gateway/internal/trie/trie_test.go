package trie_test

import (
	"slices"
	"testing"

	"github.com/fanwire/fanwire/gateway/internal/trie"
)

// file files each pattern (one subscription each) under its node, with
// the pattern as Val.
func file(root *trie.Node[string], ps ...string) {
	for _, p := range ps {
		n := root.Walk(p)
		n.Val = p
		n.N++
	}
}

func collect(root *trie.Node[string], subj string, literalFirst bool) []string {
	var got []string
	for _, n := range root.Collect(subj, nil, literalFirst) {
		got = append(got, n.Val)
	}
	slices.Sort(got)
	return got
}

// TestCollect: a subject finds every pattern that matches it, by literal
// tokens, '*' and '>', and only those that write a system subject's first
// token out when asked to.
func TestCollect(t *testing.T) {
	root := &trie.Node[string]{}
	file(root, "a.b", "a.*", "a.>", "*.b", ">", "a.b.c", "x.y", "$SYS.>", "*.*.c")
	for _, tc := range []struct {
		subj         string
		literalFirst bool
		want         []string
	}{
		{"a.b", false, []string{"*.b", ">", "a.*", "a.>", "a.b"}},
		{"a.b.c", false, []string{"*.*.c", ">", "a.>", "a.b.c"}},
		{"a", false, []string{">"}},
		{"q.b", false, []string{"*.b", ">"}},
		{"$SYS.x", true, []string{"$SYS.>"}},
		{"$SYS.x", false, []string{"$SYS.>", ">"}},
	} {
		if got := collect(root, tc.subj, tc.literalFirst); !slices.Equal(got, tc.want) {
			t.Errorf("Collect(%q, literalFirst %v) = %q, want %q", tc.subj, tc.literalFirst, got, tc.want)
		}
	}
}

// TestFindAndPrune: Find returns a filed pattern's node (or one on its
// path) and nil for one off every filed pattern's path; a node without subscriptions no longer matches, pruning
// one keeps the others, and once every one is pruned the trie is empty.
func TestFindAndPrune(t *testing.T) {
	root := &trie.Node[string]{}
	ps := []string{"a.b", "a.*", "a.>", "*.b", ">", "a.b.c.d"}
	file(root, ps...)
	if root.Find("a.x") != nil || root.Find("b") != nil {
		t.Error("Find of a pattern on no filed one's path found a node")
	}
	if n := root.Find("a.b.c"); n == nil || n.N != 0 {
		t.Errorf("Find of a pattern on a filed one's path (a.b.c.d) = %v, want its node, without subscriptions", n)
	}
	if root.Size() == 0 {
		t.Fatal("no nodes after filing patterns")
	}
	for i, p := range ps {
		n := root.Find(p)
		if n == nil || n.Val != p {
			t.Fatalf("Find(%q) = %v", p, n)
		}
		n.N--
		if slices.Contains(collect(root, "a.b", false), p) {
			t.Errorf("%q still matches with no subscription", p)
		}
		n.Prune()
		for _, q := range ps[i+1:] {
			if root.Find(q) == nil {
				t.Fatalf("pruning %q removed %q", p, q)
			}
		}
	}
	if s := root.Size(); s != 0 {
		t.Fatalf("%d nodes left after every pattern was pruned", s)
	}
}
