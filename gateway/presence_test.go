package gateway_test

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/fanwire/fanwire/broker/brokertest"
	"github.com/fanwire/fanwire/gateway"
	"github.com/fanwire/fanwire/gateway/auth"
	"github.com/golang-jwt/jwt/v5"
)

// presenceCfg makes presence quick to test: heart-beats every 200 ms, a
// node dead after 3 s of silence (15 missed beats: a loaded machine does
// not lose a live node), and anonymous members.
func presenceCfg(mutate func(*gateway.Config)) func(*gateway.Config) {
	return func(c *gateway.Config) {
		c.AllowAnonymousPresence = true
		c.PresenceHeartbeat = 200 * time.Millisecond
		c.PresenceTimeout = 3 * time.Second
		c.PresenceInterval = 100 * time.Millisecond
		c.CloseTimeout = 300 * time.Millisecond // the test clients do not answer a 1001: a stopping node cuts them soon
		if mutate != nil {
			mutate(c)
		}
	}
}

// presenceLog is what a watcher saw of a subject's members: the members
// it holds (joins and updates minus leaves) and every leave, by key.
type presenceLog struct {
	members map[string]map[string]any
	leaves  []string
	count   float64
}

// watch reads cl's messages until cond holds of what it saw, applying its
// presence messages to l.
func (l *presenceLog) watch(cl *client, cond func(*presenceLog) bool) {
	cl.t.Helper()
	if l.members == nil {
		l.members = map[string]map[string]any{}
	}
	for !cond(l) {
		m := cl.nextWithin(15 * time.Second)
		if m["type"] != "presence" {
			cl.t.Fatalf("watcher got %v, want presence messages", m)
		}
		for _, kind := range []string{"joins", "updates"} {
			list, _ := m[kind].([]any)
			for _, v := range list {
				mem := v.(map[string]any)
				l.members[mem["conn"].(string)] = mem
			}
		}
		list, _ := m["leaves"].([]any)
		for _, v := range list {
			k := v.(map[string]any)["conn"].(string)
			delete(l.members, k)
			l.leaves = append(l.leaves, k)
		}
		l.count = m["count"].(float64)
	}
}

// members asks cl's node for every member of subject, a page at a time,
// and returns their keys and the count.
func members(cl *client, subject string, page int) (keys []string, count float64) {
	cl.t.Helper()
	after := ""
	for i := 0; ; i++ {
		req := `{"type":"members","id":"m` + strconv.Itoa(i) + `","subject":"` + subject + `","limit":` + strconv.Itoa(page)
		if after != "" {
			req += `,"after":"` + after + `"`
		}
		cl.send(req + "}")
		m := cl.expect(map[string]any{"type": "members", "id": "m" + strconv.Itoa(i), "subject": subject})
		count = m["count"].(float64)
		for _, v := range m["members"].([]any) {
			keys = append(keys, v.(map[string]any)["conn"].(string))
		}
		next, _ := m["next"].(string)
		if next == "" {
			return keys, count
		}
		after = next
	}
}

// TestPresenceProtocol: track, update, untrack and a closed connection
// each reach a watcher, in order with the subject's events; members pages
// through a subject's members with their count; bad requests get their
// codes with their ids and change nothing.
func TestPresenceProtocol(t *testing.T) {
	e := newEnv(t, presenceCfg(func(c *gateway.Config) { c.PresenceRate = 1000 }))
	w := e.dial()
	w.send(`{"type":"subscribe","id":"w","subject":"room.1","presence":true}`)
	w.expect(map[string]any{"type": "subscribed", "id": "w"})

	a, b := e.dial(), e.dial()
	a.send(`{"type":"track","id":"t1","subject":"room.1","state":{ "name" : "ann" }}`)
	a.expect(map[string]any{"type": "tracked", "id": "t1"})
	w.expect(map[string]any{"type": "presence", "subject": "room.1", "subs": []any{"w"}, "count": 1,
		"joins": []any{map[string]any{"conn": a.id, "state": map[string]any{"name": "ann"}}}})
	e.publish("room.1", `{"text":"hi"}`)
	w.expect(map[string]any{"type": "event", "subject": "room.1", "data": map[string]any{"text": "hi"}})
	b.send(`{"type":"track","id":"t2","subject":"room.1"}`)
	b.expect(map[string]any{"type": "tracked", "id": "t2"})
	w.expect(map[string]any{"type": "presence", "count": 2, "joins": []any{map[string]any{"conn": b.id, "state": nil}}})
	a.send(`{"type":"track","id":"t3","subject":"room.1","state":{"name":"ann","typing":true}}`)
	a.expect(map[string]any{"type": "tracked", "id": "t3"})
	w.expect(map[string]any{"type": "presence", "count": 2, "updates": []any{map[string]any{"conn": a.id, "state": map[string]any{"name": "ann", "typing": true}}}})
	// The same state again (compacted, byte for byte) changes nothing: no message.
	a.send(`{"type":"track","id":"t4","subject":"room.1","state":{"name": "ann","typing":true}}`)
	a.expect(map[string]any{"type": "tracked", "id": "t4"})

	keys, count := members(w, "room.1", 1)
	want := []string{a.id, b.id}
	slices.Sort(want)
	if count != 2 || !slices.Equal(keys, want) {
		t.Fatalf("members: %v (count %v), want %v", keys, count, want)
	}

	b.send(`{"type":"untrack","id":"u1","subject":"room.1"}`)
	b.expect(map[string]any{"type": "untracked", "id": "u1"})
	w.expect(map[string]any{"type": "presence", "count": 1, "leaves": []any{map[string]any{"conn": b.id}}})
	b.send(`{"type":"untrack","id":"u2","subject":"room.1"}`) // not a member: the same answer, no message
	b.expect(map[string]any{"type": "untracked", "id": "u2"})
	_ = a.c.CloseNow()
	w.expect(map[string]any{"type": "presence", "count": 0, "leaves": []any{map[string]any{"conn": a.id}}})
	w.quiet()

	// Bad requests.
	c := e.dial()
	for _, tc := range []struct{ frame, code, id string }{
		{`{"type":"track","id":"x1","subject":"room.*"}`, "bad_subject", "x1"},
		{`{"type":"track","id":"x2","subject":"room.1","state":{},"sub":"admin"}`, "bad_frame", ""},
		{`{"type":"track","id":"x3","subject":"room.1","data":{}}`, "bad_frame", "x3"},
		{`{"type":"track","id":"x4","subject":"$SYS.x"}`, "forbidden", "x4"},
		{`{"type":"members","id":"x5","subject":"room.1","limit":0}`, "bad_frame", "x5"},
		{`{"type":"members","id":"x6","subject":"room.>"}`, "bad_subject", "x6"},
		{`{"type":"subscribe","id":"x7","subject":"room.1","presence":true,"from":"first"}`, "bad_frame", "x7"},
		{`{"type":"publish","id":"x8","subject":"room.1","data":{},"state":{}}`, "bad_frame", "x8"},
		{`{"type":"untrack","id":"x9"}`, "bad_frame", "x9"},
		{`{"type":"track","id":"x10","subject":"room.1","state":{"big":"` + fmt.Sprintf("%01100d", 0) + `"}}`, "too_large", "x10"},
		{`{"type":"track","id":"x11","subject":"room.1","state":{]}`, "bad_frame", ""},
	} {
		c.send(tc.frame)
		m := c.next()
		if m["type"] != "error" || m["code"] != tc.code || (tc.id != "" && m["id"] != tc.id) {
			t.Errorf("%s: got %v, want error %s with id %q", tc.frame, m, tc.code, tc.id)
		}
	}
	if keys, count := members(c, "room.1", 100); count != 0 || len(keys) != 0 {
		t.Fatalf("after refused tracks: members %v, count %v", keys, count)
	}
	w.quiet()
}

// TestPresenceLimits: a connection's tracks are capped, and track and
// untrack are rate-limited, with the message's id.
func TestPresenceLimits(t *testing.T) {
	e := newEnv(t, presenceCfg(func(c *gateway.Config) {
		c.MaxPresenceTracks = 2
		c.MaxPresenceMembers = 3
		c.PresenceRate = 2 // burst 4
	}))
	c := e.dial()
	c.send(`{"type":"track","id":"a","subject":"room.1"}`)
	c.expect(map[string]any{"type": "tracked", "id": "a"})
	c.send(`{"type":"track","id":"b","subject":"room.2"}`)
	c.expect(map[string]any{"type": "tracked", "id": "b"})
	c.send(`{"type":"track","id":"c","subject":"room.3"}`)
	c.expect(map[string]any{"type": "error", "id": "c", "code": "too_many_tracks"})
	c.send(`{"type":"track","id":"d","subject":"room.1","state":1}`)
	c.expect(map[string]any{"type": "tracked", "id": "d"})
	c.send(`{"type":"track","id":"e","subject":"room.1","state":2}`)
	c.expect(map[string]any{"type": "error", "id": "e", "code": "rate_limited"})
	keys, _ := members(c, "room.1", 10)
	if !slices.Equal(keys, []string{c.id}) {
		t.Fatalf("members %v", keys)
	}
	// The node holds 2 members; a third, then no more (an update still goes).
	d, f := e.dial(), e.dial()
	d.send(`{"type":"track","id":"a","subject":"room.1"}`)
	d.expect(map[string]any{"type": "tracked", "id": "a"})
	f.send(`{"type":"track","id":"a","subject":"room.1"}`)
	f.expect(map[string]any{"type": "error", "id": "a", "code": "too_many_members"})
	d.send(`{"type":"track","id":"b","subject":"room.1","state":1}`)
	d.expect(map[string]any{"type": "tracked", "id": "b"})
}

// TestPresenceGrants: a token tracks only where its presence claim
// matches, as its own sub (a client cannot claim another identity: the
// frame has no such field); members and presence watches need a
// subscribe grant; an anonymous connection tracks only with
// AllowAnonymousPresence; a refreshed token that drops the claim ends
// the membership.
func TestPresenceGrants(t *testing.T) {
	e, token := publishTokens(t, nil)
	w := e.dialToken(token(jwt.MapClaims{"sub": "watcher", "subscribe": []any{"room.{tenant}.*"}}))
	w.send(`{"type":"subscribe","id":"w","subject":"room.acme.*","presence":true}`)
	w.expect(map[string]any{"type": "subscribed", "id": "w"})

	u := e.dialToken(token(jwt.MapClaims{"sub": "u7", "presence": []any{"room.{tenant}.*"}}))
	u.send(`{"type":"track","id":"t","subject":"room.acme.1","state":{"sub":"admin"}}`)
	u.expect(map[string]any{"type": "tracked", "id": "t"})
	m := w.expect(map[string]any{"type": "presence", "subject": "room.acme.1", "count": 1})
	got := m["joins"].([]any)[0].(map[string]any)
	if got["sub"] != "u7" || got["conn"] == "" {
		t.Fatalf("member %v: want the token's sub u7 and the connection's id", got)
	}
	u.send(`{"type":"track","id":"t2","subject":"room.other.1"}`)
	u.expect(map[string]any{"type": "error", "id": "t2", "code": "forbidden"})

	none := e.dialToken(token(nil))
	none.send(`{"type":"track","id":"t3","subject":"room.acme.1"}`)
	none.expect(map[string]any{"type": "error", "id": "t3", "code": "forbidden"})
	anon := e.dialToken("")
	anon.send(`{"type":"track","id":"t4","subject":"room.acme.1"}`)
	anon.expect(map[string]any{"type": "error", "id": "t4", "code": "forbidden"})
	outsider := e.dialToken(token(jwt.MapClaims{"subscribe": []any{"other.>"}}))
	outsider.send(`{"type":"members","id":"m","subject":"room.acme.1"}`)
	outsider.expect(map[string]any{"type": "error", "id": "m", "code": "forbidden"})
	outsider.send(`{"type":"subscribe","id":"s","subject":"room.acme.1","presence":true}`)
	outsider.expect(map[string]any{"type": "error", "id": "s", "code": "forbidden"})

	// A refresh without the claim ends the membership.
	u.send(`{"type":"refresh","id":"r","token":"` + token(jwt.MapClaims{"sub": "u7"}) + `"}`)
	u.expect(map[string]any{"type": "error", "code": "revoked"})
	u.expect(map[string]any{"type": "refreshed", "id": "r"})
	w.expect(map[string]any{"type": "presence", "subject": "room.acme.1", "count": 0})
}

// TestPresenceBigRoom: over PresenceListLimit members a subject's changes
// are coalesced into one message per interval (a member that joins and
// leaves within it is in neither list), with the count.
func TestPresenceBigRoom(t *testing.T) {
	e := newEnv(t, presenceCfg(func(c *gateway.Config) {
		c.PresenceListLimit = 2
		c.PresenceInterval = time.Hour // flushed by the test
		c.PresenceRate = 1000
	}))
	w := e.dial()
	w.send(`{"type":"subscribe","id":"w","subject":"room.1","presence":true}`)
	w.expect(map[string]any{"type": "subscribed", "id": "w"})
	var cs []*client
	for i := range 6 {
		c := e.dial()
		c.send(`{"type":"track","id":"t","subject":"room.1","state":` + strconv.Itoa(i) + `}`)
		c.expect(map[string]any{"type": "tracked", "id": "t"})
		cs = append(cs, c)
	}
	// The first two, at once.
	w.expect(map[string]any{"type": "presence", "count": 1})
	w.expect(map[string]any{"type": "presence", "count": 2})
	// A member that comes and goes within the interval.
	x := e.dial()
	x.send(`{"type":"track","id":"t","subject":"room.1"}`)
	x.expect(map[string]any{"type": "tracked", "id": "t"})
	x.send(`{"type":"untrack","id":"u","subject":"room.1"}`)
	x.expect(map[string]any{"type": "untracked", "id": "u"})
	cs[0].send(`{"type":"untrack","id":"u","subject":"room.1"}`)
	cs[0].expect(map[string]any{"type": "untracked", "id": "u"})
	gateway.FlushPresence(e.srv)
	m := w.expect(map[string]any{"type": "presence", "count": 5})
	joins, leaves := m["joins"].([]any), m["leaves"].([]any)
	if len(joins) != 4 || len(leaves) != 1 || leaves[0].(map[string]any)["conn"] != cs[0].id || m["updates"] != nil {
		t.Fatalf("coalesced message %v: want the 4 later joins and the first member's leave", m)
	}
	w.quiet()
}

// answerClose reads cl's messages on a goroutine of its own from now on,
// dropping them, so that the client answers a server's close at once (a
// stopping node waits for the answer, up to its close timeout).
func (cl *client) answerClose() {
	go func() {
		for {
			if _, _, err := cl.c.Read(context.Background()); err != nil {
				return
			}
		}
	}()
}

// presenceNodes starts n gateways sharing one broker of kind.
func presenceNodes(t *testing.T, kind string, n int) []*env {
	first := newEnvOn(t, kind, presenceCfg(nil))
	nodes := []*env{first}
	for len(nodes) < n {
		nodes = append(nodes, first.sibling(presenceCfg(nil)))
	}
	return nodes
}

// kill stops e as a dead node would for the others: its bus goes silent
// first (no heart-beat, leave or bye reaches them), then its connections
// close. (cmd/fanwire's TestPresenceSIGKILL kills a real process.)
func (e *env) kill() {
	gateway.SilencePresence(e.srv)
	e.stop()
}

// TestPresenceAcrossNodes: on each broker, members on three nodes are
// seen by watchers on every node, and each node's members page agrees;
// when a node dies, the others see exactly its members leave, once.
func TestPresenceAcrossNodes(t *testing.T) {
	t.Parallel() // it mostly waits for its own processes (Node, Chromium, nodes): beside the others
	if testing.Short() {
		t.Skip("-short (make test-quick) leaves out the slow tests: make test runs them")
	}
	for _, kind := range []string{"nats", "jetstream", "redis"} {
		t.Run(kind, func(t *testing.T) {
			nodes := presenceNodes(t, kind, 3)
			var watchers []*client
			for i, n := range nodes[:2] {
				w := n.dial()
				w.send(`{"type":"subscribe","id":"w","subject":"app.room","presence":true}`)
				w.expect(map[string]any{"type": "subscribed", "id": "w"})
				watchers = append(watchers, w)
				_ = i
			}
			byNode := map[int][]string{}
			for i, n := range nodes {
				for j := range 3 {
					c := n.dial()
					c.send(`{"type":"track","id":"t","subject":"app.room","state":{"node":` + strconv.Itoa(i) + `,"i":` + strconv.Itoa(j) + `}}`)
					c.expect(map[string]any{"type": "tracked", "id": "t"})
					byNode[i] = append(byNode[i], c.id)
				}
			}
			logs := make([]*presenceLog, len(watchers))
			for i, w := range watchers {
				logs[i] = &presenceLog{}
				logs[i].watch(w, func(l *presenceLog) bool { return len(l.members) == 9 })
				if len(logs[i].leaves) != 0 {
					t.Fatalf("watcher %d saw leaves %v while members joined", i, logs[i].leaves)
				}
			}
			for i, n := range nodes {
				if keys, count := members(n.dial(), "app.room", 4); count != 9 || len(keys) != 9 {
					t.Fatalf("node %d lists %d members (count %v), want 9", i, len(keys), count)
				}
			}

			nodes[2].kill()
			dead := slices.Clone(byNode[2])
			slices.Sort(dead)
			for i, w := range watchers {
				l := logs[i]
				l.watch(w, func(l *presenceLog) bool { return len(l.members) == 6 })
				got := slices.Clone(l.leaves)
				slices.Sort(got)
				if !slices.Equal(got, dead) {
					t.Fatalf("watcher %d saw leaves %v, want exactly the dead node's %v", i, got, dead)
				}
				if l.count != 6 {
					t.Fatalf("watcher %d: count %v after the leaves, want 6", i, l.count)
				}
				w.quiet() // once: nothing more
			}
			for i, n := range nodes[:2] {
				if _, count := members(n.dial(), "app.room", 100); count != 6 {
					t.Fatalf("node %d counts %v members after the kill, want 6", i, count)
				}
			}
		})
	}
}

// TestPresenceLateNode: a node that starts after members joined learns
// them from the others, without any of them changing.
func TestPresenceLateNode(t *testing.T) {
	a := newEnv(t, presenceCfg(func(c *gateway.Config) { c.PresenceTimeout = time.Hour }))
	var keys []string
	for range 3 {
		c := a.dial()
		c.send(`{"type":"track","id":"t","subject":"room.1"}`)
		c.expect(map[string]any{"type": "tracked", "id": "t"})
		keys = append(keys, c.id)
	}
	wa := a.dial()
	wa.send(`{"type":"subscribe","id":"w","subject":"room.1","presence":true}`)
	wa.expect(map[string]any{"type": "subscribed", "id": "w"})

	b := a.sibling(presenceCfg(func(c *gateway.Config) { c.PresenceTimeout = time.Hour }))
	cb := b.dial()
	deadline := time.Now().Add(15 * time.Second)
	for {
		if _, count := members(cb, "room.1", 100); count == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the late node never listed the 3 members")
		}
		time.Sleep(50 * time.Millisecond)
	}
	wa.quiet() // the sync changed nothing on the first node
}

// TestPresenceNATSCluster: three ws nodes, each on its own server of a
// 3-node NATS cluster (an R3 stream). One host dies (its NATS server and
// its ws node): the others see exactly its members leave. Another node's
// NATS server dies while the node lives: its connection fails over to a
// surviving server within the timeout, and none of its members flaps.
func TestPresenceNATSCluster(t *testing.T) {
	t.Parallel() // it mostly waits for its own processes (Node, Chromium, nodes): beside the others
	servers := brokertest.NATSCluster(t, 3)
	cfg := presenceCfg(func(c *gateway.Config) {
		c.Subjects = []string{"orders.>", "app.>"}
		c.PresenceTimeout = 5 * time.Second // a fail-over (reconnect wait 250 ms to 1 s) fits many times
	})
	var nodes []*env
	for _, ns := range servers {
		nodes = append(nodes, startEnv(t, ns, "jetstream", r3, cfg))
	}
	w := nodes[0].dial()
	w.send(`{"type":"subscribe","id":"w","subject":"app.room","presence":true}`)
	w.expect(map[string]any{"type": "subscribed", "id": "w"})
	byNode := map[int][]string{}
	for i, n := range nodes {
		for range 2 {
			c := n.dial()
			c.send(`{"type":"track","id":"t","subject":"app.room"}`)
			c.expect(map[string]any{"type": "tracked", "id": "t"})
			byNode[i] = append(byNode[i], c.id)
		}
	}
	l := &presenceLog{}
	l.watch(w, func(l *presenceLog) bool { return len(l.members) == 6 })

	// Node 1's server dies; node 1 lives and fails over.
	servers[1].Shutdown()
	servers[1].WaitForShutdown()
	// Node 2's host dies: its server and its ws node.
	gateway.SilencePresence(nodes[2].srv)
	servers[2].Shutdown()
	servers[2].WaitForShutdown()
	nodes[2].stop()

	l.watch(w, func(l *presenceLog) bool { return len(l.members) == 4 })
	got, dead := slices.Clone(l.leaves), slices.Clone(byNode[2])
	slices.Sort(got)
	slices.Sort(dead)
	if !slices.Equal(got, dead) {
		t.Fatalf("leaves %v, want exactly the dead host's members %v", got, dead)
	}
	// Node 1's members stayed, and a member tracked on it now reaches
	// node 0 through the surviving server.
	c := nodes[1].dial()
	c.send(`{"type":"track","id":"t","subject":"app.room"}`)
	c.expect(map[string]any{"type": "tracked", "id": "t"})
	l.watch(w, func(l *presenceLog) bool { return len(l.members) == 5 })
	if len(l.leaves) != 2 {
		t.Fatalf("leaves %v: a member of the node whose server failed over flapped", l.leaves)
	}
	for _, k := range byNode[1] {
		if l.members[k] == nil {
			t.Fatalf("member %s of the node that failed over is gone", k)
		}
	}
}

// TestPresenceLostDelta: a change lost on the bus is repaired: the next
// heart-beat tells the other node it missed one, and it asks for the
// sender's members.
func TestPresenceLostDelta(t *testing.T) {
	if testing.Short() {
		t.Skip("-short (make test-quick) leaves out the slow tests: make test runs them")
	}
	for _, kind := range []string{"nats", "redis"} {
		t.Run(kind, func(t *testing.T) {
			nodes := presenceNodes(t, kind, 2)
			w := nodes[0].dial()
			w.send(`{"type":"subscribe","id":"w","subject":"app.room","presence":true}`)
			w.expect(map[string]any{"type": "subscribed", "id": "w"})
			// Both nodes know each other once a change of one reaches the other.
			first := nodes[1].dial()
			first.send(`{"type":"track","id":"t","subject":"app.room"}`)
			first.expect(map[string]any{"type": "tracked", "id": "t"})
			l := &presenceLog{}
			l.watch(w, func(l *presenceLog) bool { return len(l.members) == 1 })

			gateway.DropPresenceSends(nodes[1].srv, 1)
			c := nodes[1].dial()
			c.send(`{"type":"track","id":"t","subject":"app.room","state":"lost"}`)
			c.expect(map[string]any{"type": "tracked", "id": "t"})
			l.watch(w, func(l *presenceLog) bool { return len(l.members) == 2 })
			if got := l.members[c.id]["state"]; got != "lost" {
				t.Fatalf("repaired member %v", l.members[c.id])
			}
			if n := nodes[0].metric("fanwire_presence_syncs_total", nil); n < 1 {
				t.Fatalf("fanwire_presence_syncs_total %v: the repair should be a sync", n)
			}
			if len(l.leaves) != 0 {
				t.Fatalf("leaves %v during the repair", l.leaves)
			}
		})
	}
}

// TestPresenceChurnCountsAgree: members joining, changing and leaving
// at once on two nodes; when the churn stops, both nodes list exactly the
// members that remain, and a watcher on each holds the same set.
func TestPresenceChurnCountsAgree(t *testing.T) {
	if testing.Short() {
		t.Skip("-short (make test-quick) leaves out the slow tests: make test runs them")
	}
	for _, kind := range []string{"nats", "redis"} {
		t.Run(kind, func(t *testing.T) {
			nodes := presenceNodes(t, kind, 2)
			var watchers []*client
			for _, n := range nodes {
				w := n.dial()
				w.send(`{"type":"subscribe","id":"w","subject":"app.room","presence":true}`)
				w.expect(map[string]any{"type": "subscribed", "id": "w"})
				watchers = append(watchers, w)
			}
			const perNode = 20
			type result struct {
				id   string
				stay bool
			}
			results := make(chan result, 10*perNode)
			for i, n := range nodes {
				for j := range perNode {
					c := n.dial()
					go func() {
						// Join, change, and (every third) leave or close.
						// (Not c.send: a failed write is the test's, reported below.)
						send := func(s string) {
							ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
							defer cancel()
							if err := c.c.Write(ctx, websocket.MessageText, []byte(s)); err != nil {
								results <- result{id: "write failed: " + err.Error()}
							}
						}
						for k := range 3 {
							send(`{"type":"track","id":"t` + strconv.Itoa(k) + `","subject":"app.room","state":` + strconv.Itoa(k) + `}`)
						}
						stay := (i+j)%3 != 0
						if !stay {
							if j%2 == 0 {
								send(`{"type":"untrack","id":"u","subject":"app.room"}`)
							} else {
								_ = c.c.CloseNow()
							}
						}
						results <- result{c.id, stay}
					}()
				}
			}
			var want []string
			for range 2 * perNode {
				r := <-results
				if strings.HasPrefix(r.id, "write failed") {
					t.Fatal(r.id)
				}
				if r.stay {
					want = append(want, r.id)
				}
			}
			slices.Sort(want)
			for i, n := range nodes {
				cl := n.dial()
				deadline := time.Now().Add(15 * time.Second)
				for {
					keys, count := members(cl, "app.room", 7)
					if slices.Equal(keys, want) && int(count) == len(want) {
						break
					}
					if time.Now().After(deadline) {
						t.Fatalf("node %d lists %v (count %v), want %v", i, keys, count, want)
					}
					time.Sleep(50 * time.Millisecond)
				}
			}
			for i, w := range watchers {
				l := &presenceLog{}
				l.watch(w, func(l *presenceLog) bool {
					if len(l.members) != len(want) {
						return false
					}
					for _, k := range want {
						if l.members[k] == nil || l.members[k]["state"] != float64(2) {
							return false
						}
					}
					return true
				})
				if int(l.count) != len(want) {
					t.Fatalf("watcher %d: count %v, want %d", i, l.count, len(want))
				}
			}
		})
	}
}

// TestPresenceResume: a node stops (a deploy). Its members stay on the
// other nodes for the grace; a client that tracks again elsewhere with its
// resume secret is the same member (same key, no leave, no join; a new
// state is an update), and one that does not come back leaves when the
// grace ends. A secret of another sub resumes nothing.
func TestPresenceResume(t *testing.T) {
	a, err := auth.NewJWTAuth(auth.JWTConfig{SecretFile: writeFile(t, "secret", testSecret)})
	if err != nil {
		t.Fatal(err)
	}
	cfg := presenceCfg(func(c *gateway.Config) {
		c.Authenticate = a.Grant
		c.PresenceTimeout = time.Hour // the grace ends when the test sweeps
	})
	token := func(sub string) string {
		return sign(t, jwt.SigningMethodHS256, []byte(testSecret), "", jwt.MapClaims{"sub": sub, "exp": time.Now().Add(time.Hour).Unix(),
			"subscribe": []any{">"}, "presence": []any{"room.*"}})
	}
	stay := newEnv(t, cfg)
	going := stay.sibling(cfg)
	w := stay.dialToken(token("watcher"))
	w.send(`{"type":"subscribe","id":"w","subject":"room.1","presence":true}`)
	w.expect(map[string]any{"type": "subscribed", "id": "w"})

	track := func(cl *client, extra string) map[string]any {
		cl.send(`{"type":"track","id":"t","subject":"room.1","state":"s"` + extra + `}`)
		return cl.expect(map[string]any{"type": "tracked", "id": "t"})
	}
	ann, bob := going.dialToken(token("ann")), going.dialToken(token("bob"))
	annT, bobT := track(ann, ""), track(bob, "")
	if annT["member"] == "" || annT["resume"] == "" || annT["member"] == bobT["member"] {
		t.Fatalf("tracked replies %v, %v: want each member's key and secret", annT, bobT)
	}
	l := &presenceLog{}
	l.watch(w, func(l *presenceLog) bool { return len(l.members) == 2 })

	ann.answerClose()
	bob.answerClose()
	going.stop()
	waitFor(t, "the stopping node's bye", func() bool { return stay.metric("fanwire_presence_nodes", nil) == 0 })
	if _, count := members(w, "room.1", 10); count != 2 {
		t.Fatalf("count %v during the grace, want 2", count)
	}
	// Bob's secret under Ann's token resumes nothing: a new member.
	mallory := stay.dialToken(token("ann"))
	if m := track(mallory, `,"resume":"`+bobT["resume"].(string)+`"`); m["member"] == bobT["member"] {
		t.Fatalf("another sub resumed bob's member: %v", m)
	}
	l.watch(w, func(l *presenceLog) bool { return len(l.members) == 3 })
	// Ann comes back on the node that stays, with a new state.
	ann2 := stay.dialToken(token("ann"))
	ann2.send(`{"type":"track","id":"t","subject":"room.1","state":"back","resume":"` + annT["resume"].(string) + `"}`)
	ann2.expect(map[string]any{"type": "tracked", "id": "t", "member": annT["member"], "resume": annT["resume"]})
	m := w.expect(map[string]any{"type": "presence", "count": 3})
	if up, _ := m["updates"].([]any); len(up) != 1 || m["joins"] != nil || m["leaves"] != nil || up[0].(map[string]any)["conn"] != annT["member"] {
		t.Fatalf("resumed member: %v, want one update of ann's member", m)
	}
	// The grace ends: bob, who did not come back, leaves; ann stays.
	gateway.SweepPresence(stay.srv, time.Now().Add(2*time.Hour))
	w.expect(map[string]any{"type": "presence", "count": 2, "leaves": []any{map[string]any{"conn": bobT["member"], "sub": "bob"}}})
	w.quiet()
	// Ann's resumed member is hers on this node now: her connection's end is its leave.
	_ = ann2.c.CloseNow()
	w.expect(map[string]any{"type": "presence", "count": 1, "leaves": []any{map[string]any{"conn": annT["member"], "sub": "ann"}}})
}

// TestPresenceRowGrants: a row-filtered subscribe grant gives no presence
// on what it filters: no members, no watch (native and GraphQL), and an
// unfiltered grant elsewhere still does. Before, a token whose only grant
// was {"subject":"orders.*","where":"doc.customer_id == claims.sub"}
// listed another user's members at orders.99, state and all.
func TestPresenceRowGrants(t *testing.T) {
	e, token := publishTokens(t, presenceCfg(nil))
	agent := e.dialToken(token(jwt.MapClaims{"sub": "agent-9", "presence": []any{"orders.*"}, "subscribe": []any{"orders.*"}}))
	agent.send(`{"type":"track","id":"t","subject":"orders.99","state":{"note":"refund for a VIP"}}`)
	agent.expect(map[string]any{"type": "tracked", "id": "t"})

	rows := token(jwt.MapClaims{"sub": "c1", "subscribe": []any{
		map[string]any{"subject": "orders.*", "where": "doc.customer_id == claims.sub"},
		"lobby.>",
	}})
	c := e.dialToken(rows)
	c.send(`{"type":"members","id":"m","subject":"orders.99"}`)
	m := c.expect(map[string]any{"type": "error", "id": "m", "code": "forbidden"})
	if msg := m["message"].(string); !strings.Contains(msg, "filters rows") {
		t.Fatalf("the refusal does not say why: %v", m)
	}
	for _, p := range []string{"orders.*", "orders.99", "orders.>"} {
		c.send(`{"type":"subscribe","id":"w","subject":"` + p + `","presence":true}`)
		c.expect(map[string]any{"type": "error", "id": "w", "code": "forbidden"})
	}
	// The same subscriptions without presence are the row filter's.
	c.subscribe("rows", "orders.*")
	c.send(`{"type":"subscribe","id":"lobby","subject":"lobby.*","presence":true}`)
	c.expect(map[string]any{"type": "subscribed", "id": "lobby"})
	c.send(`{"type":"members","id":"m2","subject":"lobby.1"}`)
	c.expect(map[string]any{"type": "members", "id": "m2", "count": 0})

	g := e.initGQLToken(rows)
	codes, _ := gqlErrorCodes(t, g.gqlResult("q", `{ members(subject: "orders.99") { count } }`, nil))
	if len(codes) != 1 || codes[0] != "forbidden" {
		t.Fatalf("GraphQL members on a filtered grant: codes %v", codes)
	}
	g.gqlOp("s", presenceSub, map[string]any{"s": "orders.*"})
	if raw := g.nextRaw(); !strings.Contains(raw, `"type":"error"`) || !strings.Contains(raw, "forbidden") {
		t.Fatalf("GraphQL presence on a filtered grant: %s", raw)
	}

	// A refresh that filters a watched pattern ends the watch.
	r := e.dialToken(token(jwt.MapClaims{"sub": "c2", "subscribe": []any{"orders.*"}}))
	r.send(`{"type":"subscribe","id":"w","subject":"orders.*","presence":true}`)
	r.expect(map[string]any{"type": "subscribed", "id": "w"})
	r.send(`{"type":"refresh","id":"r","token":"` + token(jwt.MapClaims{"sub": "c2", "subscribe": []any{map[string]any{"subject": "orders.*", "where": "doc.customer_id == claims.sub"}}}) + `"}`)
	r.expect(map[string]any{"type": "error", "id": "w", "code": "revoked"})
	r.expect(map[string]any{"type": "refreshed", "id": "r"})
}

// TestPresenceDrainTellsNoLeaves: while a node stops, its members stay
// (on the other nodes, for the grace), and its own watchers, still
// draining, are not told otherwise: a member whose connection ends there
// first used to leave for them, and rejoined when they listed again on
// another node (a flap clients saw as a leave and a join). The barrier is
// a later join on the same node: the watcher's next message must be it.
func TestPresenceDrainTellsNoLeaves(t *testing.T) {
	stay := newEnv(t, presenceCfg(nil))
	going := stay.sibling(presenceCfg(nil))
	w := going.dial()
	w.send(`{"type":"subscribe","id":"w","subject":"room.1","presence":true}`)
	w.expect(map[string]any{"type": "subscribed", "id": "w"})
	ann := going.dial()
	ann.send(`{"type":"track","id":"t","subject":"room.1","state":"a"}`)
	annT := ann.expect(map[string]any{"type": "tracked", "id": "t"})
	l := &presenceLog{}
	l.watch(w, func(l *presenceLog) bool { return len(l.members) == 1 })

	gateway.DrainPresence(going.srv)
	_ = ann.c.CloseNow()
	waitFor(t, "ann's connection to end on the draining node", func() bool {
		return going.metric("fanwire_presence_local_members", nil) == 0
	})
	bob := going.dial()
	bob.send(`{"type":"track","id":"t","subject":"room.1","state":"b"}`)
	bobT := bob.expect(map[string]any{"type": "tracked", "id": "t"})
	m := w.nextWithin(15 * time.Second)
	joins, _ := m["joins"].([]any)
	if m["type"] != "presence" || m["leaves"] != nil || len(joins) != 1 || joins[0].(map[string]any)["conn"] != bobT["member"] || m["count"] != 2.0 {
		t.Fatalf("after ann's connection ended on the draining node, the watcher got %v; want only bob's join, count 2 (ann %v stays)", m, annT["member"])
	}
}
