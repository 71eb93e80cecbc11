package gateway_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// The client's tests (clientjs_test.go) run fanwire.js against real
// gateways: each node is a `fanwire ws` process (so it can be killed with
// SIGKILL or drained with SIGTERM, as in production), on a NATS server
// embedded in the test. This file holds what they share: the nodes, a
// steady publisher, and run.mjs, the Node client the tests drive.

// clientFixture is the npm fixture the client's tests run with (the ws
// package for Node 20, TypeScript); `make deps` installs its node_modules.
const clientFixture = "testdata/fanwirejs"

// requireClientFixture fails the test unless node and the fixture are
// installed (skipping would let CI pass without running the client), and
// returns node's path.
func requireClientFixture(t testing.TB) string {
	t.Helper()
	if testing.Short() {
		t.Skip("-short (make test-quick) leaves out the tests that start Node: make test runs them")
	}
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatal("node not found on PATH: run `make test`, which installs Node and npm")
	}
	for _, m := range []string{"ws", "typescript"} {
		if _, err := os.Stat(filepath.Join(clientFixture, "node_modules", m, "package.json")); err != nil {
			t.Fatalf("gateway/%s/node_modules/%s is missing (%v): run `make test`, which installs it (or: npm ci --prefix gateway/%s)", clientFixture, m, err, clientFixture)
		}
	}
	return node
}

// buildFanwire builds cmd/fanwire into a temporary directory of t.
func buildFanwire(t testing.TB) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "fanwire")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/fanwire/fanwire/cmd/fanwire").CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/fanwire: %v\n%s", err, out)
	}
	return bin
}

// gwNode is one `fanwire ws` process on a fixed address, so that it can be
// stopped and started again where its clients look for it.
type gwNode struct {
	t    testing.TB
	bin  string
	addr string
	args []string

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan error
	logs   *syncBuffer
}

// startGateway starts `fanwire ws args...` on a free loopback port and waits
// until it is ready. t's cleanup kills it.
func startGateway(t testing.TB, bin string, args ...string) *gwNode {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	n := &gwNode{t: t, bin: bin, addr: addr, args: args}
	t.Cleanup(func() { n.stop(syscall.SIGKILL) })
	n.start()
	return n
}

// wsURL is the node's /ws.
func (n *gwNode) wsURL() string { return "ws://" + n.addr + "/ws" }

// httpURL is the node's base URL.
func (n *gwNode) httpURL() string { return "http://" + n.addr }

// start runs the process and waits for /readyz.
func (n *gwNode) start() {
	n.t.Helper()
	n.mu.Lock()
	n.logs = &syncBuffer{}
	n.cmd = exec.Command(n.bin, append([]string{"ws", "--listen", n.addr, "--log-level", "warn"}, n.args...)...)
	n.cmd.Stdout, n.cmd.Stderr = n.logs, n.logs
	if err := n.cmd.Start(); err != nil {
		n.mu.Unlock()
		n.t.Fatal(err)
	}
	exited := make(chan error, 1)
	n.exited = exited
	cmd := n.cmd
	go func() { exited <- cmd.Wait() }()
	n.mu.Unlock()
	deadline := time.Now().Add(20 * time.Second)
	for !readyWithin(n.addr, 100*time.Millisecond) {
		select {
		case err := <-exited:
			exited <- err // for stop
			n.t.Fatalf("fanwire ws on %s exited (%v) before it was ready:\n%s", n.addr, err, n.logs.String())
		default:
		}
		if time.Now().After(deadline) {
			n.t.Fatalf("fanwire ws on %s not ready within 20s:\n%s", n.addr, n.logs.String())
		}
	}
}

// signal sends sig to the node without waiting; stop waits for its exit.
func (n *gwNode) signal(sig syscall.Signal) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd != nil {
		_ = n.cmd.Process.Signal(sig)
	}
}

// stop sends sig (SIGKILL: a crash; SIGTERM: a drain with 1001) and waits
// for the process to exit; it does nothing if the node is not running.
func (n *gwNode) stop(sig syscall.Signal) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd == nil {
		return
	}
	_ = n.cmd.Process.Signal(sig)
	select {
	case <-n.exited:
	case <-time.After(20 * time.Second):
		_ = n.cmd.Process.Kill()
		<-n.exited
		n.t.Errorf("fanwire ws on %s did not exit within 20s of %v", n.addr, sig)
	}
	n.cmd = nil
}

// readyClient asks /readyz, bounded.
var readyClient = &http.Client{Timeout: 2 * time.Second}

// readyWithin polls http://addr/readyz until it answers 200 (true) or
// within has passed (false).
func readyWithin(addr string, within time.Duration) bool {
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		resp, err := readyClient.Get("http://" + addr + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return true
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	return false
}

// jsNodeArgs are the flags of a node on the JetStream stream name of the
// NATS server at url, over app.>, admitting any connection and pages of
// any loopback origin.
func jsNodeArgs(url, stream string, more ...string) []string {
	return append([]string{"--broker", "jetstream", "--nats-url", url, "--stream", stream, "--subjects", "app.>",
		"--allow-anonymous", "--allowed-origins", "127.0.0.1:*"}, more...)
}

// steadyPublisher publishes {"n":0}, {"n":1}, ... to app.<n mod 4>, one
// every interval, each once the previous is published, until stopped.
type steadyPublisher struct {
	cancel context.CancelFunc
	done   chan struct{}
	n      int // published, read after done
	err    error
}

// publishFunc publishes one event: jsPublish's, or a Core NATS
// connection's Publish.
type publishFunc func(subject string, data []byte) error

// jsPublish publishes through js, each event stored before it returns
// (within 5 s, and not bound to the publisher's context: a publish stopped
// midway may still be stored, uncounted).
func jsPublish(js jetstream.JetStream) publishFunc {
	return func(subject string, data []byte) error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err := js.Publish(ctx, subject, data)
		return err
	}
}

func startPublisher(t testing.TB, publish publishFunc, interval time.Duration) *steadyPublisher {
	ctx, cancel := context.WithCancel(context.Background())
	p := &steadyPublisher{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(p.done)
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			if err := publish("app."+strconv.Itoa(p.n%4), fmt.Appendf(nil, `{"n":%d}`, p.n)); err != nil {
				p.err = err
				return
			}
			p.n++
		}
	}()
	t.Cleanup(func() { p.stop() })
	return p
}

// stop stops publishing and returns how many events were published.
func (p *steadyPublisher) stop() int {
	p.cancel()
	<-p.done
	return p.n
}

// checkSequence fails the test unless got is 0, 1, ..., n-1.
func checkSequence(t testing.TB, got []int, n int) {
	t.Helper()
	if len(got) == n {
		ok := true
		for i, v := range got {
			if v != i {
				ok = false
				break
			}
		}
		if ok {
			return
		}
	}
	seen := make(map[int]int)
	var dups, gaps []int
	for _, v := range got {
		seen[v]++
		if seen[v] == 2 {
			dups = append(dups, v)
		}
	}
	for i := range n {
		if seen[i] == 0 {
			gaps = append(gaps, i)
		}
	}
	t.Fatalf("got %d events for %d published: missing %v, duplicated %v, sequence %s", len(got), n, head(gaps), head(dups), headInts(got))
}

func head(v []int) string {
	if len(v) > 20 {
		return fmt.Sprint(v[:20]) + "…"
	}
	return fmt.Sprint(v)
}

func headInts(v []int) string {
	for i := 1; i < len(v); i++ {
		if v[i] != v[i-1]+1 {
			lo := max(0, i-3)
			return fmt.Sprintf("breaks at index %d: …%v…", i, v[lo:min(len(v), i+3)])
		}
	}
	return "in order"
}

// jsLine is one line run.mjs printed.
type jsLine struct {
	K       string `json:"k"`
	State   string `json:"state"`
	Code    any    `json:"code"`
	Reason  string `json:"reason"`
	URL     string `json:"url"`
	Sub     string `json:"sub"`
	Subject string `json:"subject"`
	Cursor  string `json:"cursor"`
	Message string `json:"message"`
	// Client is which of a script's clients printed the line (scenario.mjs
	// runs several in one process); Retrying is an error's retrying.
	Client   int  `json:"client"`
	Retrying bool `json:"retrying"`
	Data     struct {
		N int `json:"n"`
	} `json:"data"`
	// Presence (presence.mjs): a state line's connection id, a page's or
	// a room's members and count, a room change's conns, a page's next.
	Conn    string     `json:"conn"`
	Count   int        `json:"count"`
	Members []jsMember `json:"members"`
	Joins   []string   `json:"joins"`
	Leaves  []string   `json:"leaves"`
	Updates []string   `json:"updates"`
	Next    string     `json:"next"`
	at      time.Time
}

// jsMember is a member as presence.mjs prints it: its state as JSON text.
type jsMember struct {
	Conn  string `json:"conn"`
	State string `json:"state"`
}

// nodeRun is one `node run.mjs` process: one fanwire.js client.
type nodeRun struct {
	t      testing.TB
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stderr *syncBuffer
	done   chan struct{}
	token  func() string // answers the client's getToken

	mu      sync.Mutex
	lines   []jsLine
	changed chan struct{} // closed and replaced when a line arrives
}

// runClient starts run.mjs with cfg (see the script); token, when not nil,
// answers each getToken.
func runClient(t testing.TB, node string, cfg map[string]any, token func() string) *nodeRun {
	t.Helper()
	return runScript(t, node, nil, "run.mjs", cfg, token)
}

// runScript starts `node nodeFlags... script cfg` in the client fixture: a
// script that prints jsLines, as run.mjs does (scenario.mjs too).
func runScript(t testing.TB, node string, nodeFlags []string, script string, cfg map[string]any, token func() string) *nodeRun {
	t.Helper()
	if token != nil {
		cfg["getToken"] = true
	}
	arg, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	r := &nodeRun{t: t, stderr: &syncBuffer{}, done: make(chan struct{}), token: token, changed: make(chan struct{})}
	r.cmd = exec.Command(node, append(slices.Clone(nodeFlags), script, string(arg))...)
	r.cmd.Dir = clientFixture
	r.cmd.Stderr = r.stderr
	out, err := r.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if r.stdin, err = r.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	if err := r.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go r.read(out)
	t.Cleanup(func() {
		_ = r.stdin.Close()
		select {
		case <-r.done:
		case <-time.After(5 * time.Second):
			_ = r.cmd.Process.Kill()
			<-r.done
		}
		if t.Failed() {
			t.Logf("node client stderr:\n%s", r.stderr.String())
		}
	})
	return r
}

func (r *nodeRun) read(out io.Reader) {
	defer close(r.done)
	defer func() { _ = r.cmd.Wait() }()
	sc := bufio.NewScanner(out)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var l jsLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			r.t.Errorf("node client printed %q: %v", sc.Text(), err)
			continue
		}
		l.at = time.Now()
		if l.K == "token" {
			if r.token == nil {
				r.t.Errorf("node client asked for a token, and the test gives none")
				continue
			}
			r.send(map[string]any{"cmd": "token", "token": r.token()})
		}
		r.mu.Lock()
		r.lines = append(r.lines, l)
		close(r.changed)
		r.changed = make(chan struct{})
		r.mu.Unlock()
	}
}

// send writes one command to the client's stdin.
func (r *nodeRun) send(cmd map[string]any) {
	b, _ := json.Marshal(cmd)
	if _, err := r.stdin.Write(append(b, '\n')); err != nil {
		r.t.Errorf("node client stdin: %v", err)
	}
}

// waitFor waits until cond holds for the lines so far, or fails the test
// after within, saying what it waited for.
func (r *nodeRun) waitFor(what string, within time.Duration, cond func([]jsLine) bool) {
	r.t.Helper()
	deadline := time.After(within)
	for {
		r.mu.Lock()
		ok := cond(r.lines)
		ch := r.changed
		r.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-ch:
		case <-r.done:
			r.mu.Lock()
			ok := cond(r.lines)
			r.mu.Unlock()
			if !ok {
				r.t.Fatalf("node client exited before %s; its lines:\n%s\nstderr:\n%s", what, r.summary(), r.stderr.String())
			}
			return
		case <-deadline:
			r.t.Fatalf("no %s within %v; the client's lines:\n%s", what, within, r.summary())
		}
	}
}

// all returns the lines so far.
func (r *nodeRun) all() []jsLine {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lines
}

// events returns the n of every event line, in order.
func (r *nodeRun) events() []int { return eventNs(r.all()) }

func eventNs(lines []jsLine) []int {
	var ns []int
	for _, l := range lines {
		if l.K == "event" {
			ns = append(ns, l.Data.N)
		}
	}
	return ns
}

// count returns how many lines have kind k (and, when state is set, that state).
func count(lines []jsLine, k, state string) int {
	n := 0
	for _, l := range lines {
		if l.K == k && (state == "" || l.State == state) {
			n++
		}
	}
	return n
}

// waitEvents waits until the client has n events.
func (r *nodeRun) waitEvents(n int, within time.Duration) {
	r.t.Helper()
	r.waitFor(strconv.Itoa(n)+" events", within, func(l []jsLine) bool { return count(l, "event", "") >= n })
}

// summary is the client's lines without its events, and how many events.
func (r *nodeRun) summary() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var b strings.Builder
	events := 0
	for _, l := range r.lines {
		if l.K == "event" {
			events++
			continue
		}
		if events > 0 {
			fmt.Fprintf(&b, "  (%d events)\n", events)
			events = 0
		}
		j, _ := json.Marshal(l)
		fmt.Fprintf(&b, "  %s %s\n", l.at.Format("15:04:05.000"), j)
	}
	if events > 0 {
		fmt.Fprintf(&b, "  (%d events)\n", events)
	}
	return b.String()
}
