package presence

import (
	"runtime"
	"strconv"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
)

func benchPresence() *Presence {
	return New(Config{Registry: prometheus.NewRegistry(), Log: zap.NewNop(), ListLimit: 100,
		MailboxBytes: 4 << 20, PieceBytes: 1 << 20})
}

// BenchmarkPresenceMemberMemory: the heap one member of a 10,000-member
// subject costs a node's replica, with a 40-byte state (another node's
// member: its room entry and its node's list), reported as B/member.
func BenchmarkPresenceMemberMemory(b *testing.B) {
	const n = 10_000
	state := []byte(`{"name":"member-name","typing":false}`)
	b.ReportAllocs()
	var perMember float64
	for b.Loop() {
		p := benchPresence()
		p.peers["node-b"] = &peer{id: "node-b", members: make(map[memberRef]struct{}), partN: -1}
		keys := make([]string, n)
		for i := range keys {
			keys[i] = newPresID()
		}
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		p.mu.Lock()
		for i, k := range keys {
			p.setLocked("room.1", "node-b", nil, k, "user-"+strconv.Itoa(i), k+k, 0, state, "remote")
		}
		p.mu.Unlock()
		runtime.GC()
		runtime.ReadMemStats(&after)
		perMember = float64(after.HeapAlloc-before.HeapAlloc) / n
		runtime.KeepAlive(p)
	}
	b.ReportMetric(perMember, "B/member")
}

// BenchmarkPresenceChange: one remote member's join and leave in a
// 10,000-member subject nobody watches (the replica's cost per change).
func BenchmarkPresenceChange(b *testing.B) {
	p, state := remoteRoom(10_000)
	key := newPresID()
	b.ReportAllocs()
	for b.Loop() {
		p.mu.Lock()
		p.setLocked("room.1", "node-b", nil, key, "u", key+key, 0, state, "remote")
		p.removeLocked("room.1", "node-b", nil, key, "remote")
		p.flushLocked()
		p.mu.Unlock()
	}
}

// BenchmarkPresencePageAfterChange: a members request (first page of
// 100) on a remote room of 10,000 right after a member joined or left.
// When a change cleared the room's key order and the next page sorted
// the whole room again, this took 4-10 ms under the presence lock on
// this machine; the order is now kept as members join and leave.
func BenchmarkPresencePageAfterChange(b *testing.B) {
	p, state := remoteRoom(10_000)
	p.Flush()
	key := newPresID()
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		p.mu.Lock()
		if i%2 == 0 {
			p.setLocked("room.1", "node-b", nil, key, "u", key+key, 0, state, "remote")
		} else {
			p.removeLocked("room.1", "node-b", nil, key, "remote")
		}
		p.flushLocked()
		p.mu.Unlock()
		i++
		if _, n, _ := p.Page("room.1", "", 100, 1<<20); n < 10_000 {
			b.Fatalf("count %d", n)
		}
	}
}

// remoteRoom is a presence whose replica holds n members of node-b in
// room.1, each with state.
func remoteRoom(n int) (p *Presence, state []byte) {
	p = benchPresence()
	p.peers["node-b"] = &peer{id: "node-b", members: make(map[memberRef]struct{}), partN: -1}
	state = []byte(`{"name":"member-name","typing":false}`)
	p.mu.Lock()
	defer p.mu.Unlock()
	for i := range n {
		p.setLocked("room.1", "node-b", nil, newPresID(), "u"+strconv.Itoa(i), newResumeSecret(), 0, state, "remote")
	}
	return p, state
}
