package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/fanwire/fanwire/broker/brokertest"
)

// Presence as deployed: `fanwire ws` nodes in processes of their own on a
// broker in a process of its own (nats-server, redis-server), and
// WebSocket clients in the test's process. TestPresenceSIGKILL and
// BenchmarkPresenceDeployed share these helpers.

// presenceBroker is the flags of a `fanwire ws` on a broker process.
type presenceBroker struct {
	kind string   // nats or redis
	args []string // --broker and its address
	pid  int      // the broker's process
}

// startPresenceBroker starts kind's server in a process of its own:
// nats-server (natsBin) or redis-server; t.Cleanup stops it.
func startPresenceBroker(tb testing.TB, kind, natsBin string) presenceBroker {
	tb.Helper()
	switch kind {
	case "nats":
		url, pid := brokertest.NATSProcess(tb, natsBin)
		return presenceBroker{kind: kind, args: []string{"--broker", "nats", "--nats-url", url}, pid: pid}
	case "redis":
		r := brokertest.StartRedis(tb, tb.TempDir(), 0)
		return presenceBroker{kind: kind, args: []string{"--broker", "redis", "--redis-url", "redis://" + r.Addr()}, pid: r.PID()}
	}
	tb.Fatalf("broker %q: want nats or redis", kind)
	return presenceBroker{}
}

// wsProc is a `fanwire ws` process.
type wsProc struct {
	tb     testing.TB
	bin    string
	args   []string // its flags but --listen
	listen string   // host:port of --listen, kept across restarts
	cmd    *exec.Cmd
	exited chan struct{} // closed once cmd has exited
}

// startWSProc starts `bin ws args…` on a free port and waits until
// /readyz answers 200; t.Cleanup stops it (SIGTERM).
func startWSProc(tb testing.TB, bin string, args ...string) *wsProc {
	tb.Helper()
	port, err := freePort()
	if err != nil {
		tb.Fatal(err)
	}
	p := &wsProc{tb: tb, bin: bin, args: args, listen: "127.0.0.1:" + strconv.Itoa(port)}
	p.start()
	tb.Cleanup(p.stop)
	return p
}

// start runs the process (again) on its address and waits until it is
// ready.
func (p *wsProc) start() {
	p.tb.Helper()
	args := append([]string{"ws", "--listen", p.listen, "--console=false", "--log-level", "warn"}, p.args...)
	p.cmd = exec.Command(p.bin, args...)
	p.cmd.Stdout, p.cmd.Stderr = os.Stderr, os.Stderr
	if err := p.cmd.Start(); err != nil {
		p.tb.Fatalf("start fanwire ws: %v", err)
	}
	exited, cmd := make(chan struct{}), p.cmd
	p.exited = exited
	go func() { // owned by p: stop and kill wait for it
		_ = cmd.Wait()
		close(exited)
	}()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if resp, err := http.Get("http://" + p.listen + "/readyz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		select {
		case <-exited:
			p.tb.Fatalf("fanwire ws on %s exited before it was ready: %s", p.listen, cmd.ProcessState)
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			p.tb.Fatalf("fanwire ws on %s not ready within 30s", p.listen)
		}
	}
}

func (p *wsProc) url() string { return "ws://" + p.listen + "/ws" }
func (p *wsProc) pid() int    { return p.cmd.Process.Pid }

// kill ends the process with SIGKILL (a crash: no bye on the presence
// bus) and waits for it.
func (p *wsProc) kill() {
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.exited
}

// stop ends a running process with SIGTERM, SIGKILL after 15 s.
func (p *wsProc) stop() {
	select {
	case <-p.exited:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(15 * time.Second):
		p.kill()
	}
}

// metric is the value of an unlabelled metric on the process's /metrics.
func (p *wsProc) metric(name string) float64 {
	p.tb.Helper()
	resp, err := http.Get("http://" + p.listen + "/metrics")
	if err != nil {
		p.tb.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) == 2 && f[0] == name {
			v, _ := strconv.ParseFloat(f[1], 64)
			return v
		}
	}
	p.tb.Fatalf("no metric %s on %s", name, p.listen)
	return 0
}

// procCPU is the CPU time (user + system) process pid has used, in s.
func procCPU(tb testing.TB, pid int) float64 {
	tb.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		tb.Fatal(err)
	}
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return float64(ut+st) / 100 // USER_HZ
}

// procStatus is a "Key: n kB" field of /proc/<pid>/status, in MiB.
func procStatus(tb testing.TB, pid int, key string) float64 {
	tb.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		tb.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, key+":"); ok {
			kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
			return kb / 1024
		}
	}
	tb.Fatalf("no %s in /proc/%d/status", key, pid)
	return 0
}

// presClient is a native-protocol WebSocket client: its reader goroutine
// applies the presence messages it gets to view and hands replies to the
// request waiting for them.
type presClient struct {
	tb     testing.TB
	c      *websocket.Conn
	id     string // its connection id: its key as a member
	cancel context.CancelFunc
	done   chan struct{} // closed when the reader has ended

	mu      sync.Mutex
	waiting map[string]chan map[string]any // guarded by mu: replies awaited, by id
	view    presView                       // guarded by mu
	readErr error                          // guarded by mu: why reading ended
	errs    []string                       // guarded by mu: error messages no request awaited
}

// presView is what a watcher saw of its subjects' members: the members
// (joins and updates minus leaves), and every join and leave by key.
type presView struct {
	members map[string]bool
	joins   map[string]int
	leaves  map[string]int
	msgs    int       // presence messages
	changes int       // joins, leaves and updates in them
	updates int       // updates in them
	count   int       // the last message's count
	last    time.Time // when the last message arrived
}

// dialPres connects to url and reads its ready message; the client is
// closed by t.Cleanup unless closed before.
func dialPres(tb testing.TB, url string) (*presClient, error) {
	ctx, cancel := context.WithCancel(context.Background())
	dctx, dcancel := context.WithTimeout(ctx, 30*time.Second)
	c, _, err := websocket.Dial(dctx, url, nil)
	dcancel()
	if err != nil {
		cancel()
		return nil, err
	}
	c.SetReadLimit(16 << 20)
	_, data, err := c.Read(ctx)
	if err != nil {
		cancel()
		_ = c.CloseNow()
		return nil, fmt.Errorf("ready: %w", err)
	}
	var ready struct {
		Type string `json:"type"`
		ID   string `json:"connection_id"`
	}
	if err := json.Unmarshal(data, &ready); err != nil || ready.Type != "ready" {
		cancel()
		_ = c.CloseNow()
		return nil, fmt.Errorf("want ready, got %s", data)
	}
	pc := &presClient{tb: tb, c: c, id: ready.ID, cancel: cancel, done: make(chan struct{}),
		waiting: map[string]chan map[string]any{},
		view:    presView{members: map[string]bool{}, joins: map[string]int{}, leaves: map[string]int{}}}
	go pc.read(ctx)
	tb.Cleanup(pc.close)
	return pc, nil
}

func mustDialPres(tb testing.TB, url string) *presClient {
	tb.Helper()
	pc, err := dialPres(tb, url)
	if err != nil {
		tb.Fatal(err)
	}
	return pc
}

// close ends the connection and waits for the reader.
func (pc *presClient) close() {
	pc.cancel()
	_ = pc.c.CloseNow()
	<-pc.done
}

var presencePrefix = []byte(`{"type":"presence",`)

func (pc *presClient) read(ctx context.Context) {
	defer close(pc.done)
	for {
		_, data, err := pc.c.Read(ctx)
		if err != nil {
			pc.mu.Lock()
			pc.readErr = err
			for id, ch := range pc.waiting {
				close(ch)
				delete(pc.waiting, id)
			}
			pc.mu.Unlock()
			return
		}
		now := time.Now()
		// A frame may carry several messages, one per line.
		for _, line := range bytes.Split(data, []byte("\n")) {
			if len(line) == 0 {
				continue
			}
			if bytes.HasPrefix(line, presencePrefix) {
				pc.applyPresence(line, now)
				continue
			}
			var m map[string]any
			if err := json.Unmarshal(line, &m); err != nil {
				pc.mu.Lock()
				pc.errs = append(pc.errs, "bad message: "+string(line))
				pc.mu.Unlock()
				continue
			}
			id, _ := m["id"].(string)
			pc.mu.Lock()
			if ch := pc.waiting[id]; ch != nil {
				delete(pc.waiting, id)
				ch <- m
			} else if m["type"] == "error" {
				pc.errs = append(pc.errs, string(line))
			}
			pc.mu.Unlock()
		}
	}
}

type presMember struct {
	Conn string `json:"conn"`
}

func (pc *presClient) applyPresence(line []byte, now time.Time) {
	var m struct {
		Count   int          `json:"count"`
		Joins   []presMember `json:"joins"`
		Leaves  []presMember `json:"leaves"`
		Updates []presMember `json:"updates"`
	}
	if err := json.Unmarshal(line, &m); err != nil {
		pc.mu.Lock()
		pc.errs = append(pc.errs, "bad presence message: "+string(line))
		pc.mu.Unlock()
		return
	}
	pc.mu.Lock()
	defer pc.mu.Unlock()
	v := &pc.view
	for _, j := range m.Joins {
		v.members[j.Conn] = true
		v.joins[j.Conn]++
	}
	for _, u := range m.Updates {
		v.members[u.Conn] = true
	}
	for _, l := range m.Leaves {
		delete(v.members, l.Conn)
		v.leaves[l.Conn]++
	}
	v.msgs++
	v.changes += len(m.Joins) + len(m.Leaves) + len(m.Updates)
	v.updates += len(m.Updates)
	v.count = m.Count
	v.last = now
}

// request sends msg, whose id is id, and returns the reply with that id
// (an error reply too).
func (pc *presClient) request(id, msg string) (map[string]any, error) {
	ch := make(chan map[string]any, 1)
	pc.mu.Lock()
	if pc.readErr != nil {
		err := pc.readErr
		pc.mu.Unlock()
		return nil, err
	}
	pc.waiting[id] = ch
	pc.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := pc.c.Write(ctx, websocket.MessageText, []byte(msg)); err != nil {
		return nil, err
	}
	select {
	case m, ok := <-ch:
		if !ok {
			return nil, fmt.Errorf("connection %s ended before the reply to %s", pc.id, id)
		}
		if m["type"] == "error" {
			return m, fmt.Errorf("%s: %v", id, m)
		}
		return m, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("no reply to %s within 30s", msg)
	}
}

var reqSeq atomic.Int64

func nextReqID(prefix string) string { return prefix + strconv.FormatInt(reqSeq.Add(1), 10) }

// track makes the client a member of subject with state.
func (pc *presClient) track(subject, state string) error {
	_, _, err := pc.trackResume(subject, state, "")
	return err
}

// trackResume tracks subject with state, taking over the membership of
// the secret resume ("": none); it returns the member's key and secret.
func (pc *presClient) trackResume(subject, state, resume string) (member, secret string, err error) {
	id := nextReqID("t")
	msg := `{"type":"track","id":"` + id + `","subject":"` + subject + `","state":` + state
	if resume != "" {
		msg += `,"resume":"` + resume + `"`
	}
	m, err := pc.request(id, msg+"}")
	if err != nil {
		return "", "", err
	}
	member, _ = m["member"].(string)
	secret, _ = m["resume"].(string)
	if member == "" || secret == "" {
		return "", "", fmt.Errorf("tracked without member or resume: %v", m)
	}
	return member, secret, nil
}

// untrack ends the client's membership of subject.
func (pc *presClient) untrack(subject string) error {
	id := nextReqID("u")
	_, err := pc.request(id, `{"type":"untrack","id":"`+id+`","subject":"`+subject+`"}`)
	return err
}

// watch subscribes to pattern with presence.
func (pc *presClient) watch(pattern string) error {
	id := nextReqID("s")
	_, err := pc.request(id, `{"type":"subscribe","id":"`+id+`","subject":"`+pattern+`","presence":true}`)
	return err
}

// membersCount asks the client's node for subject's member count.
func (pc *presClient) membersCount(subject string) (int, error) {
	id := nextReqID("m")
	m, err := pc.request(id, `{"type":"members","id":"`+id+`","subject":"`+subject+`","limit":1}`)
	if err != nil {
		return 0, err
	}
	n, _ := m["count"].(float64)
	return int(n), nil
}

// memberKeys asks the client's node for every member of subject.
func (pc *presClient) memberKeys(subject string) map[string]bool {
	pc.tb.Helper()
	keys := map[string]bool{}
	after := ""
	for {
		id := nextReqID("m")
		req := `{"type":"members","id":"` + id + `","subject":"` + subject + `","limit":1000`
		if after != "" {
			req += `,"after":"` + after + `"`
		}
		m, err := pc.request(id, req+"}")
		if err != nil {
			pc.tb.Fatal(err)
		}
		list, _ := m["members"].([]any)
		for _, v := range list {
			keys[v.(map[string]any)["conn"].(string)] = true
		}
		next, _ := m["next"].(string)
		if next == "" {
			return keys
		}
		after = next
	}
}

// snapshot is a copy of the client's view, with its unsolicited errors.
func (pc *presClient) snapshot() (v presView, errs []string) {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	v = pc.view
	v.members = make(map[string]bool, len(pc.view.members))
	for k := range pc.view.members {
		v.members[k] = true
	}
	v.joins = make(map[string]int, len(pc.view.joins))
	for k, n := range pc.view.joins {
		v.joins[k] = n
	}
	v.leaves = make(map[string]int, len(pc.view.leaves))
	for k, n := range pc.view.leaves {
		v.leaves[k] = n
	}
	return v, append([]string(nil), pc.errs...)
}

// viewIs reports whether the client's members are exactly want.
func (pc *presClient) viewIs(want map[string]bool) bool {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	if len(pc.view.members) != len(want) {
		return false
	}
	for k := range want {
		if !pc.view.members[k] {
			return false
		}
	}
	return true
}

// waitUntil polls cond every 5 ms until it holds, or fails after d.
func waitUntil(tb testing.TB, d time.Duration, what string, cond func() bool) {
	tb.Helper()
	waitEvery(tb, d, 5*time.Millisecond, what, cond)
}

// waitEvery polls cond every every until it holds, or fails after d.
func waitEvery(tb testing.TB, d, every time.Duration, what string, cond func() bool) {
	tb.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			tb.Fatalf("%s: not within %v", what, d)
		}
		time.Sleep(every)
	}
}
