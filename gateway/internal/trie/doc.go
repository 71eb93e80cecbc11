// Package trie is a subject-pattern trie, the one under the gateway's
// subscription index and its view index: each level is a token of a
// pattern, with children by literal token, '*' and '>'. A Node holds what
// its owner files under one pattern (Val) and how many subscriptions end
// at it (N); Collect finds every node whose pattern matches a subject.
//
// Concurrency: none of its own. The owner's lock guards every node of a
// trie: Walk, Prune and writes to Val and N under the write side, Find and
// Collect under either side.
package trie
