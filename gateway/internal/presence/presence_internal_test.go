package presence

import (
	"testing"
	"time"
)

// TestPresenceStaleHolder: a member resumed on node a (generation 1) is
// not taken back by node b's older news of it (its list sent before it
// heard of the resume, or a late delta), and b's death then removes
// nothing of it.
func TestPresenceStaleHolder(t *testing.T) {
	p := benchPresence()
	now := time.Now()
	for _, id := range []string{"a", "b"} {
		p.peers[id] = &peer{id: id, members: make(map[memberRef]struct{}), partN: -1, heard: now}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.setLocked("room.1", "b", nil, "k1", "ann", "secret", 0, []byte(`"on b"`), "remote")
	p.setLocked("room.1", "a", nil, "k1", "ann", "secret", 1, []byte(`"on a"`), "remote")
	// b's list, sent before it heard of the resume.
	pb := p.peers["b"]
	pb.syncing = true
	p.snapPartLocked(pb, busMsg{T: "snap", N: "b", S: 7, Last: true, C: []busChange{{Subject: "room.1", Conn: "k1", Sub: "ann", State: []byte(`"on b"`), Resume: "secret"}}}, now)
	// and a late delta of b's.
	p.deltaLocked(pb, busMsg{T: "d", N: "b", S: 8, C: []busChange{{Op: "u", Subject: "room.1", Conn: "k1", Sub: "ann", State: []byte(`"late"`), Resume: "secret"}}}, now)
	m := p.rooms["room.1"].members["k1"]
	if m.node != "a" || string(m.st) != `"on a"` {
		t.Fatalf("member held by %s with %s: want a's, with its state", m.node, m.st)
	}
	p.dropPeerLocked(pb, "expired")
	if p.rooms["room.1"] == nil || p.rooms["room.1"].members["k1"] == nil {
		t.Fatal("b's death removed the member a holds")
	}
	if _, ok := p.peers["a"].members[memberRef{"room.1", "k1"}]; !ok {
		t.Fatal("a's list lacks the member it holds")
	}
}
