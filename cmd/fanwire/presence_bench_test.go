package main

// BenchmarkPresenceDeployed: presence in one big room as deployed: a
// broker in its own process (nats-server built from the version in
// go.mod, or redis-server), two `fanwire ws` processes with the default
// presence settings (heart-beat 2 s, timeout 10 s, interval 1 s, list
// limit 100), and the clients in the benchmark's process: members spread
// evenly over the two nodes, all tracking room.1, and watchers (100 per
// node by default) subscribed to room.1 with presence. Each op is one
// whole run:
//
//  1. connect the watchers and the members, then every member tracks: the
//     nodes' RSS and Go heap before and after give the memory per member
//     (each node holds every member: half its own, half the other's);
//  2. churn: 2% of the members leave, then for
//     FANWIRE_BENCH_PRESENCE_SECONDS (30) 1% of the members per second
//     leave or join, alternately, paced evenly (a join is of the member
//     that left longest ago, 2 s before: the room stays at 98%): changes delivered per second to the watchers, each node's
//     CPU (s per s) and the broker's; at its end every watcher's members
//     and both nodes' lists must equal the truth;
//  3. a burst: a tenth of the members leave, then join again all at once:
//     the time until both nodes' members counts agree on the full room,
//     and until the first and the last watcher got the message that
//     completes it (when its reader read it: the clients share the
//     benchmark's process);
//  4. SIGKILL of the second node: the time until the first and the last
//     watcher on the first node got the leaves of every one of its
//     members (each once), against timeout + sweep (1 s) + interval.
//
//	go test -run '^$' -bench BenchmarkPresenceDeployed -benchtime 1x -timeout 30m ./cmd/fanwire
//
// Environment: FANWIRE_BENCH_PRESENCE_MEMBERS (10000),
// FANWIRE_BENCH_PRESENCE_WATCHERS (per node, 100),
// FANWIRE_BENCH_PRESENCE_SECONDS (30), FANWIRE_BENCH_WS_ARGS (extra flags
// for both nodes, split on spaces), FANWIRE_BENCH_NATS_BIN. The
// benchmark's process holds every socket: members + watchers must stay
// under its file descriptor limit (20,000 here).

import (
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fanwire/fanwire/broker/brokertest"
)

func envInt(tb testing.TB, name string, def int) int {
	tb.Helper()
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	n, err := strconv.Atoi(s)
	if err != nil || n <= 0 {
		tb.Fatalf("%s=%q: want a positive integer", name, s)
	}
	return n
}

func BenchmarkPresenceDeployed(b *testing.B) {
	cfg := presenceBenchConfig{
		members:  envInt(b, "FANWIRE_BENCH_PRESENCE_MEMBERS", 10_000),
		watchers: envInt(b, "FANWIRE_BENCH_PRESENCE_WATCHERS", 100),
		seconds:  envInt(b, "FANWIRE_BENCH_PRESENCE_SECONDS", 30),
	}
	bin := buildBinary(b)
	natsBin := brokertest.NATSServerBinary(b)
	for _, kind := range []string{"nats", "redis"} {
		b.Run(kind, func(b *testing.B) {
			for range b.N {
				presenceDeployedRun(b, bin, startPresenceBroker(b, kind, natsBin), cfg)
			}
		})
	}
}

type presenceBenchConfig struct{ members, watchers, seconds int }

const benchRoom = "room.1"

// parallel runs f(0…n-1) on 64 goroutines.
func parallel(tb testing.TB, n int, f func(i int) error) {
	tb.Helper()
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
	)
	next := make(chan int)
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				if err := f(i); err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
				}
			}
		}()
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	if first != nil {
		tb.Fatal(first)
	}
}

// benchMember is a member client and whether it is a member now.
type benchMember struct {
	pc   *presClient
	node int
	in   bool // guarded by the churn's mutex
}

func presenceDeployedRun(b *testing.B, bin string, br presenceBroker, cfg presenceBenchConfig) {
	args := append(slices.Clone(br.args), "--allow-anonymous", "--allow-anonymous-presence",
		"--max-connect-rate", "20000", "--max-connections", "12000")
	args = append(args, strings.Fields(os.Getenv("FANWIRE_BENCH_WS_ARGS"))...)
	// Each node serves /debug/pprof: the heap is read after a GC (a heap
	// profile with gc=1), and FANWIRE_BENCH_PRESENCE_PPROF names a
	// directory for node 0's profiles: its heap after the joins, its CPU
	// during the churn.
	var debug []string
	procs := make([]*wsProc, 2)
	for i := range procs {
		port, err := freePort()
		if err != nil {
			b.Fatal(err)
		}
		debug = append(debug, "127.0.0.1:"+strconv.Itoa(port))
		procs[i] = startWSProc(b, bin, append(slices.Clone(args), "--debug-listen", debug[i])...)
	}
	pprofDir := os.Getenv("FANWIRE_BENCH_PRESENCE_PPROF")
	profile := func(i int, path, file string) {
		b.Helper()
		resp, err := http.Get("http://" + debug[i] + path)
		if err != nil {
			b.Fatal(err)
		}
		defer resp.Body.Close()
		w := io.Discard
		if file != "" && pprofDir != "" {
			f, err := os.Create(filepath.Join(pprofDir, b.Name()[strings.LastIndexByte(b.Name(), '/')+1:]+"-"+file))
			if err != nil {
				b.Fatal(err)
			}
			defer f.Close()
			w = f
		}
		if _, err := io.Copy(w, resp.Body); err != nil {
			b.Fatal(err)
		}
	}
	rss := func(i int) float64 { return procStatus(b, procs[i].pid(), "VmRSS") }
	heap := func(i int, file string) float64 {
		profile(i, "/debug/pprof/heap?gc=1", file)
		return procs[i].metric("go_memstats_heap_alloc_bytes") / (1 << 20)
	}

	// 1. Watchers, members, and every member tracks.
	watchers := make([]*presClient, 2*cfg.watchers)
	parallel(b, len(watchers), func(i int) error {
		pc, err := dialPres(b, procs[i%2].url())
		if err != nil {
			return err
		}
		watchers[i] = pc
		return pc.watch(benchRoom)
	})
	members := make([]*benchMember, cfg.members)
	parallel(b, cfg.members, func(i int) error {
		pc, err := dialPres(b, procs[i%2].url())
		if err != nil {
			return err
		}
		members[i] = &benchMember{pc: pc, node: i % 2}
		return nil
	})
	askers := []*presClient{watchers[0], watchers[1]} // on node 0 and node 1
	// How often both nodes are asked for their count while waiting
	// (FANWIRE_BENCH_PRESENCE_POLL). When a members request after a
	// change sorted the room (4-10 ms at 10,000 members), asking every
	// 5 ms or every 100 ms gave the same join-all and burst figures.
	pollEvery := 20 * time.Millisecond
	if s := os.Getenv("FANWIRE_BENCH_PRESENCE_POLL"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			b.Fatalf("FANWIRE_BENCH_PRESENCE_POLL=%q: %v", s, err)
		}
		pollEvery = d
	}
	countsAre := func(want int) func() bool {
		return func() bool {
			for _, a := range askers {
				if n, err := a.membersCount(benchRoom); err != nil || n != want {
					return false
				}
			}
			return true
		}
	}
	rss0 := []float64{rss(0), rss(1)}
	heap0 := []float64{heap(0, ""), heap(1, "")}
	start := time.Now()
	parallel(b, cfg.members, func(i int) error {
		members[i].in = true
		return members[i].pc.track(benchRoom, `{"n":`+strconv.Itoa(i)+`}`)
	})
	waitEvery(b, 2*time.Minute, pollEvery, "both nodes count every member", countsAre(cfg.members))
	joinAll := time.Since(start)
	truth := func(node int) map[string]bool { // node -1: all
		t := make(map[string]bool, len(members))
		for _, m := range members {
			if m.in && (node < 0 || m.node == node) {
				t[m.pc.id] = true
			}
		}
		return t
	}
	converge := func(ws []*presClient, want map[string]bool, d time.Duration, what string) {
		b.Helper()
		for _, w := range ws {
			waitUntil(b, d, what, func() bool { return w.viewIs(want) })
		}
	}
	converge(watchers, truth(-1), time.Minute, "every watcher holds every member")
	heap1 := []float64{heap(0, "heap.pprof"), heap(1, "")}
	rss1 := []float64{rss(0), rss(1)}

	// 2. Churn: 1% of the members per second leave or join, alternately.
	// A join is of the member that left longest ago: 2 s' worth of
	// members leave first (outside the measure), so none comes back
	// within the interval (its leave and join would be coalesced away).
	rate := max(1, cfg.members/100)
	ops := rate * cfg.seconds
	var mu sync.Mutex // guards members' in
	r := rand.New(rand.NewPCG(1, 2))
	var out []*benchMember // left, oldest first
	perm := r.Perm(len(members))
	for _, i := range perm[:2*rate] {
		out = append(out, members[i])
	}
	parallel(b, len(out), func(i int) error {
		mu.Lock()
		out[i].in = false
		mu.Unlock()
		return out[i].pc.untrack(benchRoom)
	})
	converge(watchers, truth(-1), time.Minute, "every watcher holds the members before the churn")
	busy := map[*benchMember]bool{}
	pickIn := func() *benchMember {
		mu.Lock()
		defer mu.Unlock()
		for {
			m := members[r.IntN(len(members))]
			if m.in && !busy[m] {
				busy[m] = true
				return m
			}
		}
	}
	var cpuProfile sync.WaitGroup
	if pprofDir != "" {
		cpuProfile.Add(1)
		go func() {
			defer cpuProfile.Done()
			profile(0, "/debug/pprof/profile?seconds="+strconv.Itoa(cfg.seconds), "cpu.pprof")
		}()
	}
	changes0, msgs0 := watcherTotals(watchers)
	cpu0 := []float64{procCPU(b, procs[0].pid()), procCPU(b, procs[1].pid()), procCPU(b, br.pid)}
	start = time.Now()
	var wg sync.WaitGroup
	var opErr error
	for i := range ops {
		if d := time.Until(start.Add(time.Duration(i) * time.Second / time.Duration(rate))); d > 0 {
			time.Sleep(d)
		}
		leave := i%2 == 0
		var m *benchMember
		if leave {
			m = pickIn()
		} else {
			mu.Lock()
			m, out = out[0], out[1:]
			busy[m] = true
			mu.Unlock()
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			var err error
			if leave {
				err = m.pc.untrack(benchRoom)
			} else {
				err = m.pc.track(benchRoom, `{"n":"back"}`)
			}
			mu.Lock()
			defer mu.Unlock()
			delete(busy, m)
			if err != nil && opErr == nil {
				opErr = err
			}
			m.in = !leave
			if leave {
				out = append(out, m)
			}
		}()
	}
	wg.Wait()
	churn := time.Since(start)
	cpuProfile.Wait()
	if opErr != nil {
		b.Fatal(opErr)
	}
	cpu1 := []float64{procCPU(b, procs[0].pid()), procCPU(b, procs[1].pid()), procCPU(b, br.pid)}
	rssChurn := []float64{rss(0), rss(1)}
	end := time.Now()
	want := truth(-1)
	converge(watchers, want, 30*time.Second, "every watcher holds the members after the churn")
	_, settle := lastMessages(watchers, end)
	changes1, msgs1 := watcherTotals(watchers)
	checkNodes(b, askers, want)

	// 3. A burst: a tenth leave, then join again at once.
	burst := members[:cfg.members/10]
	parallel(b, len(burst), func(i int) error {
		mu.Lock()
		in := burst[i].in
		burst[i].in = false
		mu.Unlock()
		if !in {
			return nil
		}
		return burst[i].pc.untrack(benchRoom)
	})
	want = truth(-1)
	waitUntil(b, time.Minute, "both nodes count the members after the burst's leaves", countsAre(len(want)))
	converge(watchers, want, 30*time.Second, "every watcher holds the members after the burst's leaves")
	start = time.Now()
	var bwg sync.WaitGroup
	errs := make(chan error, len(burst))
	for _, m := range burst {
		bwg.Add(1)
		go func() {
			defer bwg.Done()
			errs <- m.pc.track(benchRoom, `{"n":"burst"}`)
		}()
	}
	waitEvery(b, time.Minute, pollEvery, "both nodes count the members after the burst's joins", countsAre(len(want)+len(burst)))
	agree := time.Since(start)
	bwg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			b.Fatal(err)
		}
	}
	for _, m := range burst {
		m.in = true
	}
	want = truth(-1)
	converge(watchers, want, 30*time.Second, "every watcher holds the members after the burst")
	burstFirst, burstLast := lastMessages(watchers, start)
	checkNodes(b, askers, want)

	// 4. SIGKILL of node 1.
	var on0 []*presClient
	for i, w := range watchers {
		if i%2 == 0 {
			on0 = append(on0, w)
		}
	}
	leaves0 := make([]map[string]int, len(on0))
	for i, w := range on0 {
		v, _ := w.snapshot()
		leaves0[i] = v.leaves
	}
	want = truth(0)
	gone := truth(1)
	procs[1].kill()
	start = time.Now()
	converge(on0, want, time.Minute, "node 0's watchers see node 1's members leave")
	killFirst, killLast := lastMessages(on0, start)
	for i, w := range on0 {
		v, errs := w.snapshot()
		if len(errs) > 0 {
			b.Fatalf("watcher: %v", errs)
		}
		for k, n := range v.leaves {
			d := n - leaves0[i][k]
			if (gone[k] && d != 1) || (!gone[k] && d != 0) {
				b.Fatalf("after the kill, member %s left %d times (killed node's: %v)", k, d, gone[k])
			}
		}
	}
	checkNodes(b, askers[:1], want)
	for _, w := range watchers {
		if _, errs := w.snapshot(); len(errs) > 0 {
			b.Fatalf("watcher: %v", errs)
		}
	}

	n := float64(cfg.members)
	b.ReportMetric(n, "members")
	b.ReportMetric(joinAll.Seconds(), "join-all-s")
	b.ReportMetric((rss1[0]-rss0[0]+rss1[1]-rss0[1])/2*(1<<20)/n, "rss-B/member")
	b.ReportMetric((heap1[0]-heap0[0]+heap1[1]-heap0[1])/2*(1<<20)/n, "heap-B/member")
	b.ReportMetric(float64(ops)/churn.Seconds(), "churn-changes/s")
	b.ReportMetric(float64(changes1-changes0)/churn.Seconds(), "delivered-changes/s")
	b.ReportMetric(float64(msgs1-msgs0)/churn.Seconds()/float64(len(watchers)), "msgs/s/watcher")
	b.ReportMetric((cpu1[0]-cpu0[0])/churn.Seconds(), "node0-cpu-s/s")
	b.ReportMetric((cpu1[1]-cpu0[1])/churn.Seconds(), "node1-cpu-s/s")
	b.ReportMetric((cpu1[2]-cpu0[2])/churn.Seconds(), "broker-cpu-s/s")
	b.ReportMetric(rssChurn[0], "node0-rss-MiB")
	b.ReportMetric(rssChurn[1], "node1-rss-MiB")
	b.ReportMetric(settle.Seconds(), "churn-settle-s")
	b.ReportMetric(agree.Seconds(), "burst-agree-s")
	b.ReportMetric(burstFirst.Seconds(), "burst-first-watcher-s")
	b.ReportMetric(burstLast.Seconds(), "burst-watchers-s")
	b.ReportMetric(killFirst.Seconds(), "kill-to-leaves-first-watcher-s")
	b.ReportMetric(killLast.Seconds(), "kill-to-leaves-s")
}

// lastMessages is when the first and the last of the watchers got their
// last presence message, from since (0 for none since).
func lastMessages(ws []*presClient, since time.Time) (first, last time.Duration) {
	first = time.Duration(1<<63 - 1)
	for _, w := range ws {
		w.mu.Lock()
		d := max(0, w.view.last.Sub(since))
		w.mu.Unlock()
		first, last = min(first, d), max(last, d)
	}
	return first, last
}

// watcherTotals is the changes and messages the watchers got so far.
func watcherTotals(ws []*presClient) (changes, msgs int) {
	for _, w := range ws {
		w.mu.Lock()
		changes += w.view.changes
		msgs += w.view.msgs
		w.mu.Unlock()
	}
	return changes, msgs
}

// checkNodes fails unless the askers' nodes list exactly want.
func checkNodes(tb testing.TB, askers []*presClient, want map[string]bool) {
	tb.Helper()
	for i, a := range askers {
		got := a.memberKeys(benchRoom)
		if len(got) != len(want) {
			tb.Fatalf("node %d lists %d members, want %d", i, len(got), len(want))
		}
		for k := range want {
			if !got[k] {
				tb.Fatalf("node %d does not list member %s", i, k)
			}
		}
	}
}
