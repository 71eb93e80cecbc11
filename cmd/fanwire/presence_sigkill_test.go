package main

import (
	"maps"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/fanwire/fanwire/broker/brokertest"
)

// TestPresenceSIGKILL: three `fanwire ws` processes on a broker process
// (nats-server, redis-server), members on each, watchers on two. One node
// is killed with SIGKILL (no bye): on the two others, exactly its members
// leave, once, after --presence-timeout, and both nodes count the same
// members. Then the node is started again (a new process: a new node),
// its clients connect again and track again: the watchers see them join,
// and no other member leaves or joins again. Last, the restarted node's
// clients resume their memberships on the first node with their secrets,
// and the restarted node is killed: nobody sees them leave or join, then
// or once the timeout has passed.
func TestPresenceSIGKILL(t *testing.T) {
	t.Parallel() // a process-level test that mostly waits: beside the others (make test's time)
	bin := buildBinary(t)
	for _, kind := range []string{"nats", "redis"} {
		t.Run(kind, func(t *testing.T) {
			br := startPresenceBroker(t, kind, brokertest.DebianNATS)
			testPresenceSIGKILL(t, bin, br)
		})
	}
}

func testPresenceSIGKILL(t *testing.T, bin string, br presenceBroker) {
	const (
		subject = "room.1"
		perNode = 5
		timeout = 3 * time.Second
	)
	args := append(slices.Clone(br.args), "--allow-anonymous", "--allow-anonymous-presence",
		"--presence-heartbeat", "200ms", "--presence-timeout", timeout.String(), "--presence-interval", "100ms",
		"--max-connections", "1000") // within the file descriptor limit: no warning
	nodes := []*wsProc{startWSProc(t, bin, args...), startWSProc(t, bin, args...), startWSProc(t, bin, args...)}
	a, b, c := nodes[0], nodes[1], nodes[2]

	watchers := []*presClient{mustDialPres(t, a.url()), mustDialPres(t, b.url())}
	for _, w := range watchers {
		if err := w.watch("room.*"); err != nil {
			t.Fatal(err)
		}
	}
	// One client per node asks for the members count.
	askers := []*presClient{watchers[0], watchers[1], mustDialPres(t, c.url())}

	members := make([][]*presClient, len(nodes)) // by node
	all := map[string]bool{}
	for i, n := range nodes {
		for j := range perNode {
			m := mustDialPres(t, n.url())
			if err := m.track(subject, `{"node":`+strconv.Itoa(i)+`,"n":`+strconv.Itoa(j)+`}`); err != nil {
				t.Fatal(err)
			}
			members[i] = append(members[i], m)
			all[m.id] = true
		}
	}
	countsAre := func(askers []*presClient, want int) func() bool {
		return func() bool {
			for _, a := range askers {
				if n, err := a.membersCount(subject); err != nil || n != want {
					return false
				}
			}
			return true
		}
	}
	for i, w := range watchers {
		waitUntil(t, 20*time.Second, "watcher "+strconv.Itoa(i)+" sees every member", func() bool { return w.viewIs(all) })
	}
	waitUntil(t, 20*time.Second, "every node counts every member", countsAre(askers, len(all)))
	for _, a := range askers {
		if got := a.memberKeys(subject); !maps.Equal(got, all) {
			t.Fatalf("members on %s: %v, want %v", a.id, got, all)
		}
	}

	// SIGKILL the third node.
	killed := map[string]bool{}
	for _, m := range members[2] {
		killed[m.id] = true
	}
	survivors := maps.Clone(all)
	maps.DeleteFunc(survivors, func(k string, _ bool) bool { return killed[k] })
	c.kill()
	start := time.Now()
	for i, w := range watchers {
		waitUntil(t, 4*timeout+5*time.Second, "watcher "+strconv.Itoa(i)+" sees the killed node's members leave",
			func() bool { return w.viewIs(survivors) })
	}
	t.Logf("%s: the killed node's members left after %v (timeout %v)", br.kind, time.Since(start).Round(time.Millisecond), timeout)
	waitUntil(t, 10*time.Second, "the survivors count the same members", countsAre(askers[:2], len(survivors)))
	for _, a := range askers[:2] {
		if got := a.memberKeys(subject); !maps.Equal(got, survivors) {
			t.Fatalf("members after the kill: %v, want %v", got, survivors)
		}
	}

	// The node starts again; its clients come back and track again.
	for _, m := range members[2] {
		m.close()
	}
	c.start()
	back := map[string]bool{}
	secrets := map[string]string{} // the returning members' resume secrets
	askers[2] = mustDialPres(t, c.url())
	for j := range perNode {
		m := mustDialPres(t, c.url())
		key, secret, err := m.trackResume(subject, `{"node":2,"n":`+strconv.Itoa(j)+`}`, "")
		if err != nil {
			t.Fatal(err)
		}
		if key != m.id {
			t.Fatalf("a new member's key is %s, want its connection's id %s", key, m.id)
		}
		back[m.id] = true
		secrets[m.id] = secret
	}
	now := maps.Clone(survivors)
	maps.Copy(now, back)
	for i, w := range watchers {
		waitUntil(t, 20*time.Second, "watcher "+strconv.Itoa(i)+" sees the returning members join", func() bool { return w.viewIs(now) })
	}
	waitUntil(t, 20*time.Second, "every node counts the same members", countsAre(askers, len(now)))
	for _, a := range askers {
		if got := a.memberKeys(subject); !maps.Equal(got, now) {
			t.Fatalf("members after the restart: %v, want %v", got, now)
		}
	}
	// A second's worth of heart-beats and syncs more: nothing flaps.
	hb := time.Now()
	waitUntil(t, 10*time.Second, "more heart-beats", func() bool { return time.Since(hb) > time.Second })

	for i, w := range watchers {
		v, errs := w.snapshot()
		if len(errs) > 0 {
			t.Fatalf("watcher %d: errors: %v", i, errs)
		}
		if !maps.Equal(v.members, now) {
			t.Fatalf("watcher %d holds %v, want %v", i, v.members, now)
		}
		if v.count != len(now) {
			t.Fatalf("watcher %d: last count %d, want %d", i, v.count, len(now))
		}
		for k := range all {
			if v.joins[k] != 1 {
				t.Errorf("watcher %d: %s joined %d times, want once", i, k, v.joins[k])
			}
			want := 0
			if killed[k] {
				want = 1
			}
			if v.leaves[k] != want {
				t.Errorf("watcher %d: %s left %d times, want %d", i, k, v.leaves[k], want)
			}
		}
		for k := range back {
			if v.joins[k] != 1 || v.leaves[k] != 0 {
				t.Errorf("watcher %d: returning %s joined %d times and left %d, want 1 and 0", i, k, v.joins[k], v.leaves[k])
			}
		}
		if len(v.joins) != len(all)+len(back) || len(v.leaves) != len(killed) {
			t.Errorf("watcher %d: %d members joined and %d left, want %d and %d", i, len(v.joins), len(v.leaves), len(all)+len(back), len(killed))
		}
	}
	for _, n := range []*wsProc{a, b} {
		if got := n.metric("fanwire_presence_nodes_expired_total"); got != 1 {
			t.Errorf("node %s expired %v nodes, want 1", n.listen, got)
		}
	}
	if t.Failed() {
		return
	}

	// The restarted node's clients resume on the first node (a client that
	// moved: a new network, a balancer's choice), then that node is
	// killed with SIGKILL while it still holds their old connections.
	// Resumed first, their members are the first node's: the dead node's
	// expiry removes none of them. (Resumed after the kill, they race the
	// timeout: a client must be back within it, which no test can make
	// certain on a loaded machine.)
	before := make([]presView, len(watchers))
	for i, w := range watchers {
		before[i], _ = w.snapshot()
	}
	for key, secret := range secrets {
		got, again, err := mustDialPres(t, a.url()).trackResume(subject, `{"node":2,"n":"resumed"}`, secret)
		if err != nil {
			t.Fatal(err)
		}
		if got != key || again != secret {
			t.Fatalf("resumed member %s (secret %s), want %s (secret %s)", got, again, key, secret)
		}
	}
	c.kill()
	// Past the dead node's timeout and its sweep: its members were resumed,
	// so nothing leaves.
	waitEvery(t, 4*timeout+5*time.Second, 100*time.Millisecond, "the survivors expire the killed node", func() bool {
		return a.metric("fanwire_presence_nodes_expired_total") == 2 && b.metric("fanwire_presence_nodes_expired_total") == 2
	})
	for _, w := range watchers {
		waitUntil(t, 10*time.Second, "the watchers see the resumed members' new state", func() bool {
			v, _ := w.snapshot()
			return v.updates >= len(secrets)
		})
	}
	waitUntil(t, 10*time.Second, "the survivors count the same members", countsAre(askers[:2], len(now)))
	for i, w := range watchers {
		v, errs := w.snapshot()
		if len(errs) > 0 {
			t.Fatalf("watcher %d: errors: %v", i, errs)
		}
		if !maps.Equal(v.members, now) || v.count != len(now) {
			t.Fatalf("watcher %d holds %v (count %d) after the resumes, want %v", i, v.members, v.count, now)
		}
		if !maps.Equal(v.joins, before[i].joins) || !maps.Equal(v.leaves, before[i].leaves) {
			t.Errorf("watcher %d saw joins or leaves across the resumes: joins %v → %v, leaves %v → %v",
				i, before[i].joins, v.joins, before[i].leaves, v.leaves)
		}
		if v.updates-before[i].updates != len(secrets) {
			t.Errorf("watcher %d saw %d updates across the resumes, want %d (one new state each)", i, v.updates-before[i].updates, len(secrets))
		}
	}
	for _, a := range askers[:2] {
		if got := a.memberKeys(subject); !maps.Equal(got, now) {
			t.Fatalf("members after the resumes: %v, want %v", got, now)
		}
	}
}
