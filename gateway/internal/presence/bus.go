package presence

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"slices"
	"sync"
	"time"

	"go.uber.org/zap"
)

// The presence bus protocol: how the ws nodes sharing a broker keep each
// other's members (broker.Bus: at most once, in order per sender, nothing
// stored). Each node is the authority for its own connections' members;
// the others keep a replica of them:
//
//   - "d" (delta): a node's member changes, numbered 1, 2, 3… ("s"). A
//     node applies a peer's deltas in order; a missing number means it
//     missed one, and it asks for the peer's list.
//   - "hb" (heart-beat): every Config.PresenceHeartbeat, with the number
//     of the node's last delta, so a lost last delta is seen too. A peer
//     not heard from for Config.PresenceTimeout is dead: its members
//     leave, once, on every node (each node removes them from its own
//     replica and tells its own subscribers).
//   - "sync": a node asks another ("to"; "": every node) for its members.
//     A node sends it when it starts, when its bus (re)connects, when it
//     meets a node whose deltas it did not see from the first, and on a
//     gap.
//   - "snap": a node's members, in parts of at most snapPart, with the
//     number of its last delta: the asker replaces what it held of that
//     node by the list (a member it held and the list lacks leaves, a new
//     one joins, a changed state is an update: nothing that did not
//     change is told) and applies the deltas it received meanwhile after
//     that number. Every node receives it; those not waiting for it
//     ignore it.
//   - "bye": the node stops (a graceful shutdown): its members leave at
//     once everywhere, and its later messages are ignored.
//
// A node's id is new at each start: a restarted node is a new node, whose
// members are its clients that came back (they track again); its
// previous self's members leave once, when it said bye or when its
// heart-beats stopped. A node that is only slow (heart-beats late by less
// than the timeout) loses nothing, and nodes' members never flap when a
// node joins: it asks for their lists, which change nothing elsewhere.
type busMsg struct {
	T    string      `json:"t"`
	N    string      `json:"n"`
	S    uint64      `json:"s,omitempty"`
	To   string      `json:"to,omitempty"`
	P    int         `json:"p,omitempty"`
	Last bool        `json:"last,omitempty"`
	C    []busChange `json:"c,omitempty"`
}

// busChange is a member's change in a delta ("o": j, u or l), or a
// member in a snapshot.
type busChange struct {
	Op      string          `json:"o,omitempty"`
	Subject string          `json:"r"`
	Conn    string          `json:"k"`
	Sub     string          `json:"u,omitempty"`
	State   json.RawMessage `json:"st,omitempty"`
	Resume  string          `json:"rs,omitempty"` // the member's resume secret (nodes only, never clients)
	Gen     uint32          `json:"g,omitempty"`  // the member's holder generation (setLocked)
}

// memberRef names a member across rooms.
type memberRef struct{ subject, conn string }

// peer is another node, as this one knows it.
type peer struct {
	id      string
	seq     uint64                 // its last delta applied
	heard   time.Time              // its last message
	members map[memberRef]struct{} // its members in this replica
	syncing bool                   // waiting for its snapshot
	asked   time.Time              // when this node last asked for it
	held    []busMsg               // its deltas received while syncing
	parts   []busChange            // the snapshot being received
	partN   int                    // the next part expected; -1: none being received
}

const (
	snapPart       = 256             // members per snapshot part
	maxHeld        = 4096            // deltas held for a syncing peer before asking again
	syncRetry      = 3 * time.Second // a sync unanswered this long is asked again
	sweepEvery     = time.Second     // how often dead peers are looked for
	goneFor        = time.Minute     // how long a node that said bye is ignored
	byeTimeout     = 2 * time.Second // the bye's send at shutdown
	busSendTimeout = 5 * time.Second // one bus message
	busListenRetry = 500 * time.Millisecond
)

// sendLocked queues a local change for the bus.
func (p *Presence) sendLocked(c busChange) {
	if p.bus == nil || p.closed {
		return
	}
	p.out = append(p.out, c)
	p.signal()
}

func (p *Presence) signal() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// Run owns the presence's goroutines: the sender (deltas, heart-beats,
// snapshots, coalesced deliveries, the dead-peer sweep) and the bus
// listener. It returns when ctx is done and both have exited, after the
// node's bye.
func (p *Presence) Run(ctx context.Context) {
	var wg sync.WaitGroup
	if p.bus != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.listen(ctx)
		}()
	}
	p.loop(ctx)
	wg.Wait()
}

func (p *Presence) listen(ctx context.Context) {
	for ctx.Err() == nil {
		err := p.bus.BusListen(ctx, p.receive, func() {
			// Listening (again): what was sent meanwhile may be lost.
			p.mu.Lock()
			p.ctrl = append(p.ctrl, busMsg{T: "sync", N: p.self})
			p.mu.Unlock()
			p.signal()
		})
		if ctx.Err() != nil {
			return
		}
		p.m.lost.Inc()
		p.cfg.Log.Warn("presence: bus listener stopped; listening again", zap.Error(err))
		t := time.NewTimer(busListenRetry)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
		}
	}
}

func (p *Presence) loop(ctx context.Context) {
	hb := time.NewTicker(p.cfg.Heartbeat)
	defer hb.Stop()
	flush := time.NewTicker(p.cfg.Interval)
	defer flush.Stop()
	sweep := time.NewTicker(sweepEvery)
	defer sweep.Stop()
	for {
		beat := false
		select {
		case <-ctx.Done():
			p.stop()
			return
		case <-p.wake:
		case <-hb.C:
			beat = true
		case <-flush.C:
			p.mu.Lock()
			p.flushLocked()
			p.unlock()
			continue
		case <-sweep.C:
			p.Sweep(time.Now())
		}
		if p.bus != nil {
			p.sendPending(ctx, beat)
		}
	}
}

// Drain starts the node's stop (the gateway's Shutdown): it says bye now, and
// its connections' ends no longer make their members leave: the other
// nodes keep them for the grace, for their clients to resume elsewhere.
func (p *Presence) Drain() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.drained || p.bus == nil {
		return
	}
	p.drained = true
	p.ctrl = append(p.ctrl, busMsg{T: "bye", N: p.self})
	p.signal()
}

// stop says bye (the node's members leave everywhere at once) and sends
// nothing after it.
func (p *Presence) stop() {
	p.mu.Lock()
	p.closed = true
	p.out = nil
	p.mu.Unlock()
	if p.bus == nil || p.silent.Load() {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), byeTimeout)
	defer cancel()
	b, _ := json.Marshal(busMsg{T: "bye", N: p.self})
	if err := p.bus.BusSend(ctx, b); err != nil {
		p.cfg.Log.Warn("presence: bye not sent: the other nodes remove this node's members when its heart-beats stop", zap.Error(err))
	}
}

// sendPending sends, in this order, the local changes as deltas, the sync
// requests, the node's snapshot if asked for, and a heart-beat if beat.
func (p *Presence) sendPending(ctx context.Context, beat bool) {
	limit := max(p.bus.BusLimit()/2, 4096)
	var msgs [][]byte
	p.mu.Lock()
	for len(p.out) > 0 {
		n, size := 0, 64
		for n < len(p.out) && (n == 0 || size+len(p.out[n].State)+len(p.out[n].Subject)+64 < limit) {
			size += len(p.out[n].State) + len(p.out[n].Subject) + 64
			n++
		}
		p.seq++
		b, _ := json.Marshal(busMsg{T: "d", N: p.self, S: p.seq, C: p.out[:n]})
		msgs = append(msgs, b)
		p.out = p.out[n:]
	}
	p.out = nil
	for _, m := range p.ctrl {
		b, _ := json.Marshal(m)
		msgs = append(msgs, b)
	}
	p.ctrl = nil
	if p.snap {
		p.snap = false
		msgs = append(msgs, p.snapshotLocked(limit)...)
	}
	if beat {
		b, _ := json.Marshal(busMsg{T: "hb", N: p.self, S: p.seq})
		msgs = append(msgs, b)
	}
	p.mu.Unlock()
	if p.silent.Load() {
		return
	}
	for _, b := range msgs {
		if p.drop.Load() > 0 && p.drop.Add(-1) >= 0 {
			continue // lost, as the bus may lose it
		}
		sctx, cancel := context.WithTimeout(ctx, busSendTimeout)
		err := p.bus.BusSend(sctx, b)
		cancel()
		if err != nil {
			// The peers see the gap at the next delta or heart-beat that
			// reaches them, and ask for this node's list.
			p.m.lost.Inc()
			if ctx.Err() == nil {
				p.cfg.Log.Debug("presence: bus send failed", zap.Error(err))
			}
		}
	}
}

// snapshotLocked encodes this node's members as snapshot parts.
func (p *Presence) snapshotLocked(limit int) [][]byte {
	var all []busChange
	for c, subjects := range p.local {
		for subject, key := range subjects {
			r := p.rooms[subject]
			if r == nil {
				continue
			}
			if m := r.members[key]; m != nil && m.node == p.self && m.owner == c {
				all = append(all, busChange{Subject: subject, Conn: key, Sub: m.sub, State: m.st, Resume: m.resume, Gen: m.gen})
			}
		}
	}
	var msgs [][]byte
	part := 0
	for {
		n, size := 0, 64
		for n < len(all) && n < snapPart && (n == 0 || size+len(all[n].State)+len(all[n].Subject)+64 < limit) {
			size += len(all[n].State) + len(all[n].Subject) + 64
			n++
		}
		last := n == len(all)
		b, _ := json.Marshal(busMsg{T: "snap", N: p.self, S: p.seq, P: part, Last: last, C: all[:n]})
		msgs = append(msgs, b)
		all = all[n:]
		part++
		if last {
			return msgs
		}
	}
}

// receive applies one bus message (the listener's handler).
func (p *Presence) receive(data []byte) {
	var m busMsg
	if err := json.Unmarshal(data, &m); err != nil || m.N == "" {
		p.m.lost.Inc()
		return
	}
	if m.N == p.self {
		return
	}
	now := time.Now()
	p.mu.Lock()
	defer p.unlock()
	if p.closed {
		return
	}
	if until, ok := p.gone[m.N]; ok {
		if now.Before(until) {
			return
		}
		delete(p.gone, m.N)
	}
	pr := p.peers[m.N]
	if m.T == "bye" {
		if pr != nil {
			// Its members stay for the grace (the timeout), for their
			// clients to resume them on another node; those not resumed
			// leave then (sweep).
			for ref := range pr.members {
				p.leaving[ref] = now.Add(p.cfg.Timeout)
			}
			delete(p.peers, pr.id)
			p.m.nodes.Set(float64(len(p.peers)))
		}
		p.gone[m.N] = now.Add(goneFor)
		return
	}
	if m.T == "sync" {
		if m.To == "" || m.To == p.self {
			p.snap = true
			p.signal()
		}
		if m.To != "" {
			return
		}
		// A node that starts (or listens again) asks every node: it is
		// news of that node too.
	}
	if pr == nil {
		pr = &peer{id: m.N, members: make(map[memberRef]struct{}), partN: -1}
		p.peers[m.N] = pr
		p.m.nodes.Set(float64(len(p.peers)))
		switch {
		case m.T == "d" && m.S == 1, m.T == "hb" && m.S == 0, m.T == "sync":
			// Met from its first delta on (or it has none yet, or it
			// just started): nothing to ask.
		case m.T == "snap" && m.P == 0:
			// Its list, asked for by another node (or by this one when
			// it started), begins: take it.
			pr.syncing, pr.asked = true, now
		default:
			p.askLocked(pr, now)
		}
	}
	pr.heard = now
	switch m.T {
	case "hb":
		if !pr.syncing && m.S > pr.seq {
			p.askLocked(pr, now) // its last deltas did not reach this node
		}
	case "d":
		p.deltaLocked(pr, m, now)
	case "snap":
		p.snapPartLocked(pr, m, now)
	}
}

// askLocked asks pr for its members.
func (p *Presence) askLocked(pr *peer, now time.Time) {
	pr.syncing = true
	pr.asked = now
	p.ctrl = append(p.ctrl, busMsg{T: "sync", N: p.self, To: pr.id})
	p.signal()
}

func (p *Presence) deltaLocked(pr *peer, m busMsg, now time.Time) {
	if pr.syncing {
		if len(pr.held) >= maxHeld {
			pr.held = nil
			p.askLocked(pr, now)
		}
		pr.held = append(pr.held, m)
		return
	}
	switch {
	case m.S <= pr.seq:
		return // seen
	case m.S != pr.seq+1:
		pr.held = append(pr.held, m)
		p.askLocked(pr, now)
		return
	}
	p.applyDeltaLocked(pr, m)
}

func (p *Presence) applyDeltaLocked(pr *peer, m busMsg) {
	pr.seq = m.S
	for _, c := range m.C {
		switch c.Op {
		case "j", "u":
			p.setLocked(c.Subject, pr.id, nil, c.Conn, c.Sub, c.Resume, c.Gen, c.State, "remote")
		case "l":
			if p.removeLocked(c.Subject, pr.id, nil, c.Conn, "remote") {
				delete(pr.members, memberRef{c.Subject, c.Conn})
			}
		}
	}
}

func (p *Presence) snapPartLocked(pr *peer, m busMsg, now time.Time) {
	if !pr.syncing {
		return
	}
	if m.P == 0 {
		pr.parts, pr.partN = pr.parts[:0], 0
	}
	if m.P != pr.partN {
		pr.partN = -1 // joined in the middle: wait for the next one
		return
	}
	pr.parts = append(pr.parts, m.C...)
	pr.partN++
	if !m.Last {
		return
	}
	p.m.syncs.Inc()
	want := make(map[memberRef]struct{}, len(pr.parts))
	for _, c := range pr.parts {
		want[memberRef{c.Subject, c.Conn}] = struct{}{}
	}
	var gone []memberRef
	for ref := range pr.members {
		if _, ok := want[ref]; !ok {
			gone = append(gone, ref)
		}
	}
	sortRefs(gone)
	for _, ref := range gone {
		p.removeLocked(ref.subject, pr.id, nil, ref.conn, "remote")
		delete(pr.members, ref)
	}
	for _, c := range pr.parts {
		p.setLocked(c.Subject, pr.id, nil, c.Conn, c.Sub, c.Resume, c.Gen, c.State, "remote")
	}
	pr.parts, pr.partN = nil, -1
	pr.seq = m.S
	pr.syncing = false
	held := pr.held
	pr.held = nil
	slices.SortFunc(held, func(a, b busMsg) int { return cmp.Compare(a.S, b.S) })
	for _, d := range held {
		if pr.syncing {
			pr.held = append(pr.held, d)
			continue
		}
		p.deltaLocked(pr, d, now)
	}
}

// sortRefs orders members by subject, then key.
func sortRefs(refs []memberRef) {
	slices.SortFunc(refs, func(a, b memberRef) int {
		if a.subject != b.subject {
			return cmp.Compare(a.subject, b.subject)
		}
		return cmp.Compare(a.conn, b.conn)
	})
}

// Sweep removes the members of peers not heard from for the timeout, and
// asks again for lists not received.
func (p *Presence) Sweep(now time.Time) {
	p.mu.Lock()
	defer p.unlock()
	for _, pr := range p.peers {
		switch {
		case now.Sub(pr.heard) > p.cfg.Timeout:
			p.m.expired.Inc()
			p.cfg.Log.Info("presence: a node missed its heart-beats: its members leave",
				zap.String("node", pr.id), zap.Int("members", len(pr.members)), zap.Duration("silent_for", now.Sub(pr.heard)))
			p.dropPeerLocked(pr, "expired")
		case pr.syncing && now.Sub(pr.asked) > syncRetry:
			p.askLocked(pr, now)
		}
	}
	for id, until := range p.gone {
		if now.After(until) {
			delete(p.gone, id)
		}
	}
	var due []memberRef
	for ref, until := range p.leaving {
		if now.After(until) {
			due = append(due, ref)
		}
	}
	sortRefs(due)
	for _, ref := range due {
		if r := p.rooms[ref.subject]; r != nil {
			if m := r.members[ref.conn]; m != nil {
				p.removeLocked(ref.subject, m.node, m.owner, ref.conn, "expired")
			}
		}
		delete(p.leaving, ref)
	}
}

// dropPeerLocked removes pr and its members.
func (p *Presence) dropPeerLocked(pr *peer, origin string) {
	refs := make([]memberRef, 0, len(pr.members))
	for ref := range pr.members {
		refs = append(refs, ref)
	}
	sortRefs(refs)
	for _, ref := range refs {
		p.removeLocked(ref.subject, pr.id, nil, ref.conn, origin)
	}
	delete(p.peers, pr.id)
	p.m.nodes.Set(float64(len(p.peers)))
}

var ErrStateTooLarge = errors.New("state too large")

// Silence makes the node send nothing more on the bus, as a node that
// died: the others learn it only from its missing heart-beats. For tests.
func (p *Presence) Silence() { p.silent.Store(true) }

// DropSends makes the node lose its next n messages on the bus (at most
// once: as a broker may lose them). For tests.
func (p *Presence) DropSends(n int) { p.drop.Store(int32(n)) }
