package gateway_test

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fanwire/fanwire/broker/brokertest"
	"github.com/fanwire/fanwire/gateway"
)

// fanwire.js's presence (track, untrack, members, the room helper
// client.presence) against gateways in the test process that share one
// embedded NATS (e.sibling), each node holding the presence replica: Node
// clients run run.mjs with presence.mjs's commands.

// TestClientJSPresence: a room on one node follows members tracked on
// both; a stopped node's members leave and come back as new members
// through the other node; a rate_limited track sends only the newest
// state, a second later.
func TestClientJSPresence(t *testing.T) {
	t.Parallel() // it mostly waits for its own processes (Node, Chromium, nodes): beside the others
	node := requireClientFixture(t)

	t.Run("track and room across two nodes", func(t *testing.T) {
		e1 := newEnv(t, presenceCfg(nil))
		e2 := e1.sibling(presenceCfg(nil))
		w := runClient(t, node, map[string]any{"urls": []string{e2.wsURL()}}, nil)
		w.send(map[string]any{"cmd": "room", "name": "r", "subject": "room.1"})
		apiWait(w, "the room's first listing", func(l []jsLine) bool { return has(l, "room_synced", "r") })

		a := runClient(t, node, map[string]any{"urls": []string{e1.wsURL()}}, nil)
		b := runClient(t, node, map[string]any{"urls": []string{e2.wsURL()}}, nil)
		aConn, bConn := connID(t, a, 1), connID(t, b, 1)

		a.send(map[string]any{"cmd": "track", "name": "t1", "subject": "room.1", "state": map[string]any{"name": "ann"}})
		apiWait(a, "t1 tracked", func(l []jsLine) bool { return has(l, "tracked", "t1") || has(l, "track_error", "t1") })
		waitRoom(t, w, "r", map[string]string{aConn: `{"name":"ann"}`})
		a.send(map[string]any{"cmd": "track", "name": "t2", "subject": "room.1", "state": map[string]any{"name": "ann", "typing": true}})
		waitRoom(t, w, "r", map[string]string{aConn: `{"name":"ann","typing":true}`})
		b.send(map[string]any{"cmd": "track", "name": "t3", "subject": "room.1"}) // no state: null
		waitRoom(t, w, "r", map[string]string{aConn: `{"name":"ann","typing":true}`, bConn: "null"})

		// members, a page at a time, from the other node.
		first, second := min(aConn, bConn), max(aConn, bConn)
		w.send(map[string]any{"cmd": "members", "name": "p1", "subject": "room.1", "limit": 1})
		apiWait(w, "page 1", func(l []jsLine) bool { return has(l, "members", "p1") || has(l, "members_error", "p1") })
		if _, p := find(w.all(), "members", "p1"); p.Count != 2 || len(p.Members) != 1 || p.Members[0].Conn != first || p.Next != first {
			t.Fatalf("page 1 of room.1 with limit 1: %+v, want count 2, member %s and next %s:\n%s", p, first, first, w.summary())
		}
		w.send(map[string]any{"cmd": "members", "name": "p2", "subject": "room.1", "after": first, "limit": 1})
		apiWait(w, "page 2", func(l []jsLine) bool { return has(l, "members", "p2") || has(l, "members_error", "p2") })
		if _, p := find(w.all(), "members", "p2"); p.Count != 2 || len(p.Members) != 1 || p.Members[0].Conn != second || p.Next != "" {
			t.Fatalf("page 2 of room.1: %+v, want member %s and no next:\n%s", p, second, w.summary())
		}

		a.send(map[string]any{"cmd": "untrack", "name": "u1", "subject": "room.1"})
		apiWait(a, "u1 untracked", func(l []jsLine) bool { return has(l, "untracked", "u1") || has(l, "untrack_error", "u1") })
		waitRoom(t, w, "r", map[string]string{bConn: "null"})
		b.send(map[string]any{"cmd": "close"}) // a closed connection leaves
		waitRoom(t, w, "r", map[string]string{})

		// Every change, in order, each with the count it left.
		want := []string{
			"joins [] leaves [] updates [] count 0", // the first listing
			"joins [" + aConn + "] leaves [] updates [] count 1",
			"joins [] leaves [] updates [" + aConn + "] count 1",
			"joins [" + bConn + "] leaves [] updates [] count 2",
			"joins [] leaves [" + aConn + "] updates [] count 1",
			"joins [] leaves [" + bConn + "] updates [] count 0",
		}
		if got := roomChanges(w.all(), "r", 0); !slices.Equal(got, want) {
			t.Fatalf("the room's changes:\n  %s\nwant:\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
		}
		if n := count(w.all(), "room_synced", ""); n != 1 {
			t.Fatalf("the room listed %d times without a reconnect, want 1:\n%s", n, w.summary())
		}

		// Refused: the promise rejects with the gateway's code, and the
		// subject is not tracked (nor tracked again).
		a.send(map[string]any{"cmd": "track", "name": "big", "subject": "room.2", "state": strings.Repeat("x", 2000)})
		apiWait(a, "big refused", func(l []jsLine) bool { return has(l, "tracked", "big") || has(l, "track_error", "big") })
		if _, l := find(a.all(), "track_error", "big"); l.Code != "too_large" || l.Subject != "room.2" {
			t.Fatalf("a state over --max-presence-state: %+v, want too_large for room.2:\n%s", l, a.summary())
		}
		if has(a.all(), "error", "") {
			t.Fatalf("the client reported errors besides the refused track:\n%s", a.summary())
		}
	})

	t.Run("changes while the room lists", func(t *testing.T) {
		// 12 members on e1 come and go while a room on e2 lists them a
		// page of one at a time: whatever changed during the listing,
		// the room ends with the members there are.
		cfg := presenceCfg(func(c *gateway.Config) { c.PresenceRate = 1000 })
		e1 := newEnv(t, cfg)
		e2 := e1.sibling(cfg)
		var conns []*client
		in := map[*client]bool{}
		state := map[string]string{} // conn -> the state it tracks
		toggle := func(i int) {
			c := conns[i%len(conns)]
			id := fmt.Sprint("x", i)
			if in[c] {
				c.send(`{"type":"untrack","id":"` + id + `","subject":"room.9"}`)
				c.expect(map[string]any{"type": "untracked", "id": id})
			} else {
				c.send(`{"type":"track","id":"` + id + `","subject":"room.9","state":{"i":` + fmt.Sprint(i) + `}}`)
				c.expect(map[string]any{"type": "tracked", "id": id})
				state[c.id] = `{"i":` + fmt.Sprint(i) + `}`
			}
			in[c] = !in[c]
		}
		for range 12 {
			conns = append(conns, e1.dial())
		}
		for i := range 12 {
			toggle(i)
		}
		w := runClient(t, node, map[string]any{"urls": []string{e2.wsURL()}}, nil)
		connID(t, w, 1)
		w.send(map[string]any{"cmd": "room", "name": "r", "subject": "room.9", "pageSize": 1})
		listed := func() bool { return has(w.all(), "room_synced", "r") }
		i := 12
		for deadline := time.Now().Add(clientWait); !listed(); i++ {
			if time.Now().After(deadline) {
				t.Fatalf("the room did not list within %v:\n%s", clientWait, w.summary())
			}
			toggle(i)
		}
		want := map[string]string{}
		for _, c := range conns {
			if in[c] {
				want[c.id] = state[c.id]
			}
		}
		lister := e2.dial()
		waitFor(t, fmt.Sprintf("e2 to list the %d members the test left", len(want)), func() bool {
			keys, _ := members(lister, "room.9", 1000)
			return len(keys) == len(want)
		})
		waitRoom(t, w, "r", want)
		t.Logf("%d changes while listing", i-12)
	})

	t.Run("a node stops", func(t *testing.T) {
		e1 := newEnv(t, presenceCfg(nil))
		e2 := e1.sibling(presenceCfg(nil))
		fast := map[string]any{"backoff": map[string]any{"initial": 100, "max": 500}}
		both := []string{e1.wsURL(), e2.wsURL()}
		// a moves to e2 and resumes its membership; c knows only e1, so
		// its member is not resumed and leaves when the grace ends (the
		// same sweep that would remove a's, had a not resumed it).
		b := runClient(t, node, map[string]any{"urls": []string{e2.wsURL()}}, nil)
		a := runClient(t, node, map[string]any{"urls": both, "options": fast}, nil)
		c := runClient(t, node, map[string]any{"urls": []string{e1.wsURL()}, "options": fast}, nil)
		bKey, aKey, cKey := connID(t, b, 1), connID(t, a, 1), connID(t, c, 1)
		for _, x := range []struct {
			r    *nodeRun
			name string
		}{{a, "ann"}, {b, "bob"}, {c, "cat"}} {
			x.r.send(map[string]any{"cmd": "track", "name": "t", "subject": "room.1", "state": map[string]any{"name": x.name}})
			apiWait(x.r, x.name+" tracked", func(l []jsLine) bool { return has(l, "tracked", "t") || has(l, "track_error", "t") })
		}
		if _, l := find(a.all(), "tracked", "t"); l.Conn != aKey {
			t.Fatalf("a's track resolved with key %q, want its connection id %s", l.Conn, aKey)
		}

		// w watches from the node that stays; v from the one that stops,
		// and moves to the other with a.
		w := runClient(t, node, map[string]any{"urls": []string{e2.wsURL()}}, nil)
		v := runClient(t, node, map[string]any{"urls": both, "options": fast}, nil)
		before := map[string]string{aKey: `{"name":"ann"}`, bKey: `{"name":"bob"}`, cKey: `{"name":"cat"}`}
		for _, r := range []*nodeRun{w, v} {
			r.send(map[string]any{"cmd": "room", "name": "r", "subject": "room.1"})
			waitRoom(t, r, "r", before)
		}
		connID(t, v, 1)
		fromW := len(w.all())

		e1.stop() // graceful: its clients get 1001, its members stay for the grace
		if a2 := connID(t, a, 2); a2 == aKey {
			t.Fatalf("a's second connection has the first one's id %s", aKey)
		}
		connID(t, v, 2)
		waitRoom(t, w, "r", map[string]string{aKey: `{"name":"ann"}`, bKey: `{"name":"bob"}`}) // c's grace is over
		// A barrier: a's update reaches w after anything e2 sent before it.
		a.send(map[string]any{"cmd": "track", "name": "t2", "subject": "room.1", "state": map[string]any{"name": "ann", "back": true}})
		after := map[string]string{aKey: `{"back":true,"name":"ann"}`, bKey: `{"name":"bob"}`}
		waitRoom(t, w, "r", after)
		waitRoom(t, v, "r", after)

		// w saw c leave and a change its state: a's member was never gone.
		want := []string{
			"joins [] leaves [" + cKey + "] updates [] count 2",
			"joins [] leaves [] updates [" + aKey + "] count 2",
		}
		if got := roomChanges(w.all(), "r", fromW); !slices.Equal(got, want) {
			t.Fatalf("w's room changes since the stop:\n  %s\nwant:\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
		}
		apiWait(a, "t2 tracked", func(l []jsLine) bool { return has(l, "tracked", "t2") || has(l, "track_error", "t2") })
		if _, l := find(a.all(), "tracked", "t2"); l.Conn != aKey {
			t.Fatalf("a's track on its second connection resolved with key %q, want %s (resumed)", l.Conn, aKey)
		}
		// v listed again after its reconnect: a (resumed) and b the same,
		// so the difference is at most c's leave, then a's update.
		got := strings.Join(roomChanges(v.all(), "r", lastIndex(v.all(), "state", "connected")), " | ")
		if strings.Count(got, cKey) != 1 || strings.Contains(got, bKey) || strings.Contains(got, "joins ["+aKey) || strings.Contains(got, "leaves ["+aKey) {
			t.Fatalf("v's room changes after its reconnect: %s; want c %s to leave once, b %s unchanged, a %s updated only", got, cKey, bKey, aKey)
		}
		if n := count(v.all(), "room_synced", ""); n != 2 {
			t.Fatalf("v's room listed %d times, want twice (once per connection):\n%s", n, v.summary())
		}
	})

	t.Run("a node is killed", func(t *testing.T) {
		// fanwire ws processes, so that one can die with SIGKILL: no bye;
		// the other node keeps its members until --presence-timeout, and
		// a resumes its own through the other node.
		bin := buildFanwire(t)
		url := brokertest.NATS(t).ClientURL()
		args := jsNodeArgs(url, "PRESKILL", "--allow-anonymous-presence", "--presence-heartbeat", "200ms", "--presence-timeout", "3s")
		n1, n2 := startGateway(t, bin, args...), startGateway(t, bin, args...)
		fast := map[string]any{"backoff": map[string]any{"initial": 100, "max": 500}}
		a := runClient(t, node, map[string]any{"urls": []string{n1.wsURL(), n2.wsURL()}, "options": fast}, nil)
		c := runClient(t, node, map[string]any{"urls": []string{n1.wsURL()}, "options": fast}, nil)
		aKey, cKey := connID(t, a, 1), connID(t, c, 1)
		a.send(map[string]any{"cmd": "track", "name": "t", "subject": "app.room.1", "state": map[string]any{"name": "ann"}})
		c.send(map[string]any{"cmd": "track", "name": "t", "subject": "app.room.1", "state": map[string]any{"name": "cat"}})
		w := runClient(t, node, map[string]any{"urls": []string{n2.wsURL()}}, nil)
		w.send(map[string]any{"cmd": "room", "name": "r", "subject": "app.room.1"})
		waitRoom(t, w, "r", map[string]string{aKey: `{"name":"ann"}`, cKey: `{"name":"cat"}`})
		from := len(w.all())

		n1.stop(syscall.SIGKILL)
		connID(t, a, 2)
		waitRoom(t, w, "r", map[string]string{aKey: `{"name":"ann"}`}) // n1's timeout is over
		a.send(map[string]any{"cmd": "track", "name": "t2", "subject": "app.room.1", "state": map[string]any{"name": "ann", "back": true}})
		waitRoom(t, w, "r", map[string]string{aKey: `{"back":true,"name":"ann"}`})
		want := []string{
			"joins [] leaves [" + cKey + "] updates [] count 1",
			"joins [] leaves [] updates [" + aKey + "] count 1",
		}
		if got := roomChanges(w.all(), "r", from); !slices.Equal(got, want) {
			t.Fatalf("w's room changes since the kill:\n  %s\nwant:\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
		}
	})

	t.Run("rate limited: the newest state, a second later", func(t *testing.T) {
		e := newEnv(t, presenceCfg(func(c *gateway.Config) { c.PresenceRate = 1 })) // burst 2
		watch := e.dial()
		watch.send(`{"type":"subscribe","id":"w","subject":"room.1","presence":true}`)
		watch.expect(map[string]any{"type": "subscribed", "id": "w"})
		a := runClient(t, node, map[string]any{"urls": []string{e.wsURL()}}, nil)
		aConn := connID(t, a, 1)
		a.send(map[string]any{"cmd": "track", "name": "n0", "subject": "room.1", "state": map[string]any{"n": 0}})
		apiWait(a, "n0 tracked", func(l []jsLine) bool { return has(l, "tracked", "n0") || has(l, "track_error", "n0") })
		watch.expect(map[string]any{"type": "presence", "count": 1, "joins": []any{map[string]any{"conn": aConn, "state": map[string]any{"n": 0}}}})

		// In one tick: two other subjects take what is left of the burst,
		// so n1 is dropped (rate_limited); n2 and n3 come while n1 is on
		// its way and wait for its answer.
		a.sendBatch(
			map[string]any{"cmd": "track", "name": "x2", "subject": "room.2"},
			map[string]any{"cmd": "track", "name": "x3", "subject": "room.3"},
			map[string]any{"cmd": "track", "name": "n1", "subject": "room.1", "state": map[string]any{"n": 1}},
			map[string]any{"cmd": "track", "name": "n2", "subject": "room.1", "state": map[string]any{"n": 2}},
			map[string]any{"cmd": "track", "name": "n3", "subject": "room.1", "state": map[string]any{"n": 3}},
		)
		apiWait(a, "every track answered", func(l []jsLine) bool {
			return count(l, "tracked", "")+count(l, "track_error", "") == 6
		})
		lines := a.all()
		if n := count(lines, "tracked", ""); n != 6 {
			t.Fatalf("want every track confirmed:\n%s", a.summary())
		}
		if _, n1 := find(lines, "tracked", "n1"); n1.Data.N < 1000 {
			t.Fatalf("n1 was confirmed %d ms after it was asked, want a second at least (dropped, then sent again after a second):\n%s", n1.Data.N, a.summary())
		}
		// The watcher sees n:3 straight after n:0: n1 was dropped, n2 never sent.
		watch.expect(map[string]any{"type": "presence", "count": 1, "updates": []any{map[string]any{"conn": aConn, "state": map[string]any{"n": 3}}}})
		watch.quiet()
		limited := e.metric("fanwire_client_errors_total", map[string]string{"code": "rate_limited"})
		if limited < 1 || limited > 3 {
			t.Fatalf("%v rate_limited answers, want 1 to 3 (one per subject per second at most)", limited)
		}
		if has(lines, "error", "") {
			t.Fatalf("the client reported errors:\n%s", a.summary())
		}
	})
}

// sendBatch writes cmds to the client's stdin in one write: the script
// reads them in one tick.
func (r *nodeRun) sendBatch(cmds ...map[string]any) {
	var b []byte
	for _, c := range cmds {
		j, _ := json.Marshal(c)
		b = append(append(b, j...), '\n')
	}
	if _, err := r.stdin.Write(b); err != nil {
		r.t.Errorf("node client stdin: %v", err)
	}
}

// connID waits for the client's n-th connection and returns its id.
func connID(t *testing.T, r *nodeRun, n int) string {
	t.Helper()
	var id string
	apiWait(r, fmt.Sprintf("connection %d", n), func(l []jsLine) bool {
		seen := 0
		for _, x := range l {
			if x.K == "state" && x.State == "connected" {
				if seen++; seen == n {
					id = x.Conn
					return true
				}
			}
		}
		return false
	})
	if id == "" {
		t.Fatalf("connection %d has no id:\n%s", n, r.summary())
	}
	return id
}

// roomNow is the room's members (conn -> state) and count as its last
// change or listing left them.
func roomNow(lines []jsLine, name string) (map[string]string, int, bool) {
	for i := len(lines) - 1; i >= 0; i-- {
		l := lines[i]
		if l.Sub != name || (l.K != "room_change" && l.K != "room_synced") {
			continue
		}
		m := make(map[string]string, len(l.Members))
		for _, x := range l.Members {
			m[x.Conn] = x.State
		}
		return m, l.Count, true
	}
	return nil, 0, false
}

// waitRoom waits until the room holds exactly want, with its count.
func waitRoom(t *testing.T, r *nodeRun, name string, want map[string]string) {
	t.Helper()
	apiWait(r, fmt.Sprintf("room %s to hold %v", name, want), func(l []jsLine) bool {
		got, n, ok := roomNow(l, name)
		if !ok || n != len(want) || len(got) != len(want) {
			return false
		}
		for k, v := range want {
			if got[k] != v {
				return false
			}
		}
		return true
	})
}

// roomChanges is the room's changes from line from on, as text.
func roomChanges(lines []jsLine, name string, from int) []string {
	var out []string
	for _, l := range lines[max(from, 0):] {
		if l.K == "room_change" && l.Sub == name {
			out = append(out, fmt.Sprintf("joins %v leaves %v updates %v count %d", l.Joins, l.Leaves, l.Updates, l.Count))
		}
	}
	return out
}
