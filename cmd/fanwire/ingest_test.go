package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fanwire/fanwire/broker"
	"github.com/fanwire/fanwire/broker/brokertest"
	"github.com/fanwire/fanwire/cdc/pgtest"
	"github.com/jackc/pgx/v5"
)

// buildBinary builds fanwire from this tree once per test run (a build
// per test cost about 2 s each, 40 s of the package's tests) and returns
// its path; TestMain removes it. A test must not change the file.
func buildBinary(t testing.TB) string {
	t.Helper()
	if testing.Short() {
		t.Skip("-short (make test-quick) leaves out the tests that start fanwire processes: make test runs them")
	}
	built.once.Do(func() {
		dir, err := os.MkdirTemp("", "fanwire-test-bin-")
		if err != nil {
			built.err = err
			return
		}
		built.dir = dir
		bin := filepath.Join(dir, "fanwire")
		if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
			built.err = fmt.Errorf("go build: %v\n%s", err, out)
			return
		}
		built.bin = bin
	})
	if built.err != nil {
		t.Fatal(built.err)
	}
	return built.bin
}

// built is the binary buildBinary built.
var built struct {
	once     sync.Once
	bin, dir string
	err      error
}

// TestIngestKilledMidStreamPublishesEveryChangeOnce kills the ingest
// process with SIGKILL while single-row transactions keep committing, then
// starts it again: every committed change is in the broker exactly once
// (the slot re-sends what was not confirmed; the broker drops the ids it
// has), on JetStream and on Redis Streams.
func TestIngestKilledMidStreamPublishesEveryChangeOnce(t *testing.T) {
	t.Parallel() // a process-level test that mostly waits: beside the others (make test's time)
	bin := buildBinary(t)
	forEachIngestBroker(t, 60*time.Second, 0, func(ctx context.Context, t *testing.T, pg *pgtest.Server, args []string, count func() map[string]int) {
		port, err := freePort()
		if err != nil {
			t.Fatal(err)
		}
		args = append([]string{"ingest", "--pg", pg.DSN("postgres"), "--listen", fmt.Sprintf("127.0.0.1:%d", port), "--log-level", "warn"}, args...)
		var logs bytes.Buffer
		var logMu sync.Mutex
		start := starter(t, bin, args, &logs, &logMu)
		cmd := start()
		// Writers: 1,500 single-row transactions, while the ingest is
		// killed and started again.
		const n = 1500
		written := writeRows(ctx, pg.DSN("postgres"), n)
		// Kill it once events flow, then twice more.
		cmd = killThrice(cmd, start, func() int { return len(count()) }, 300, 0)
		defer func() {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}()
		if err := <-written; err != nil {
			t.Fatal(err)
		}
		checkOnce(t, count, n, func() string {
			logMu.Lock()
			defer logMu.Unlock()
			return logs.String()
		})
	})
}

// TestIngestFailover runs two ingest processes for one slot while
// single-row transactions keep committing: one leads, the other waits as
// a standby (not ready, fanwire_ingest_standby 1). First the leader
// freezes (SIGSTOP; --leader-timeout 3s), then three times it is killed
// with SIGKILL: each time the standby takes over, and the old leader is
// started again as the new standby. Every committed change is in
// the broker exactly once, on JetStream and on Redis Streams. The
// takeover times are logged (docs/benchmarks.md, "Ingest failover").
func TestIngestFailover(t *testing.T) {
	t.Parallel() // a process-level test that mostly waits: beside the others (make test's time)
	bin := buildBinary(t)
	forEachIngestBroker(t, 90*time.Second, 0, func(ctx context.Context, t *testing.T, pg *pgtest.Server, bargs []string, count func() map[string]int) {
		var logs bytes.Buffer
		var logMu sync.Mutex
		type ingest struct {
			addr  string
			start func() *exec.Cmd
			cmd   *exec.Cmd
		}
		var nodes [2]*ingest
		for i := range nodes {
			port, err := freePort()
			if err != nil {
				t.Fatal(err)
			}
			addr := fmt.Sprintf("127.0.0.1:%d", port)
			args := append([]string{"ingest", "--pg", pg.DSN("postgres"), "--listen", addr, "--log-level", "info", "--leader-timeout", "3s"}, bargs...)
			nodes[i] = &ingest{addr: addr, start: starter(t, bin, args, &logs, &logMu)}
		}
		defer func() {
			for _, n := range nodes {
				if n.cmd != nil {
					_ = n.cmd.Process.Kill()
					_ = n.cmd.Wait()
				}
			}
		}()
		dump := func() string {
			logMu.Lock()
			defer logMu.Unlock()
			return logs.String()
		}
		// waitFor polls an ingest's /readyz or /metrics until ok.
		waitFor := func(n *ingest, what string, ok func(status int, body string) bool) {
			t.Helper()
			path := "/readyz"
			if what == "standby" {
				path = "/metrics"
			}
			deadline := time.Now().Add(30 * time.Second)
			for time.Now().Before(deadline) {
				if resp, err := http.Get("http://" + n.addr + path); err == nil {
					body, _ := io.ReadAll(resp.Body)
					resp.Body.Close()
					if ok(resp.StatusCode, string(body)) {
						return
					}
				}
				time.Sleep(10 * time.Millisecond)
			}
			t.Fatalf("ingest on %s never became %s; logs:\n%s", n.addr, what, dump())
		}
		ready := func(status int, _ string) bool { return status == http.StatusOK }
		standby := func(_ int, body string) bool {
			return strings.Contains(body, "\nfanwire_ingest_standby 1\n") && strings.Contains(body, "\nfanwire_ingest_ready 0\n")
		}
		leader, follower := nodes[0], nodes[1]
		leader.cmd = leader.start()
		waitFor(leader, "ready", ready)
		follower.cmd = follower.start()
		waitFor(follower, "standby", standby)

		const n = 1500
		written := writeRows(ctx, pg.DSN("postgres"), n)
		// First the leader freezes (SIGSTOP: its sockets stay open, so
		// PostgreSQL sees nothing wrong but its silence); then it is killed
		// three times.
		for round := 1; round <= 4; round++ {
			deadline := time.Now().Add(30 * time.Second)
			for len(count()) < round*300 && time.Now().Before(deadline) {
				time.Sleep(20 * time.Millisecond)
			}
			how := "SIGKILL"
			if round == 1 {
				how = "SIGSTOP"
				_ = leader.cmd.Process.Signal(syscall.SIGSTOP)
			} else {
				_ = leader.cmd.Process.Kill()
			}
			stopped := time.Now()
			waitFor(follower, "ready", ready)
			t.Logf("round %d: the standby took over (ready) %v after the leader's %s", round, time.Since(stopped).Round(time.Millisecond), how)
			_ = leader.cmd.Process.Kill() // a stopped process dies too
			_ = leader.cmd.Wait()
			leader.cmd = leader.start()
			waitFor(leader, "standby", standby)
			leader, follower = follower, leader
		}
		if err := <-written; err != nil {
			t.Fatal(err)
		}
		checkOnce(t, count, n, dump)
		if out := dump(); !strings.Contains(out, "taking over the slot") || !strings.Contains(out, "terminating its walsender") {
			t.Fatalf("no takeover, or no frozen leader's walsender terminated, in the logs:\n%s", out)
		}
	})
}

// forEachIngestBroker runs test, as a subtest per broker (JetStream, Redis
// Streams), with a PostgreSQL cluster holding the table t (id, v), the
// ingest's broker flags and a count of the events in the broker by key.
// dedup is the broker's duplicate window (0: the default).
func forEachIngestBroker(t *testing.T, timeout, dedup time.Duration, test func(ctx context.Context, t *testing.T, pg *pgtest.Server, brokerArgs []string, count func() map[string]int)) {
	for _, kind := range []string{"jetstream", "redis"} {
		t.Run(kind, func(t *testing.T) {
			pg := pgtest.Start(t, pgtest.Config{})
			pg.Exec("postgres", "CREATE TABLE t (id int PRIMARY KEY, v int)")
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			defer cancel()
			args, count := ingestBroker(ctx, t, kind, dedup)
			test(ctx, t, pg, args, count)
		})
	}
}

// ingestBroker starts a broker of kind ("jetstream" or "redis") for an
// ingest process, with duplicate window dedup (0: the default): the
// ingest's broker flags, and a function that counts the events in the
// broker by their key.
func ingestBroker(ctx context.Context, t *testing.T, kind string, dedup time.Duration) (args []string, count func() map[string]int) {
	t.Helper()
	var d broker.Durable
	until := "js:1000000000" // past every event: a replay of everything
	switch kind {
	case "jetstream":
		ns := brokertest.NATS(t)
		args = []string{"--broker", "jetstream", "--nats-url", ns.ClientURL(), "--subjects", "db.>", "--stream", "CDC"}
		b, err := broker.DialJetStream(ctx, broker.JetStreamConfig{NATSConfig: broker.NATSConfig{URL: ns.ClientURL(), Subjects: []string{"db.>"}}, Stream: "CDC", Duplicates: dedup})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = b.Close() })
		d = b
	case "redis":
		until = "rs:99999999999999-0"
		url := "redis://" + brokertest.Redis(t)
		args = []string{"--broker", "redis", "--redis-url", url, "--stream", "cdc"}
		b, err := broker.DialRedis(ctx, broker.RedisConfig{URL: url, Stream: "cdc", DedupWindow: dedup})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = b.Close() })
		d = b
	default:
		t.Fatalf("no broker %q", kind)
	}
	if dedup != 0 {
		args = append(args, "--dedup-window", dedup.String())
	}
	return args, func() map[string]int {
		ids := map[string]int{}
		_ = d.Replay(ctx, []string{"db.>"}, "", until, func(ms []broker.Message) error {
			for _, m := range ms {
				var e struct {
					Key any `json:"key"`
				}
				if err := json.Unmarshal(m.Data, &e); err != nil {
					return err
				}
				ids[fmt.Sprint(e.Key)]++
			}
			return nil
		})
		return ids
	}
}

// writeRows commits n single-row transactions into t, pausing a little
// every 300 rows; the channel gets the outcome.
func writeRows(ctx context.Context, dsn string, n int) <-chan error {
	written := make(chan error, 1)
	go func() {
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			written <- err
			return
		}
		defer conn.Close(context.Background())
		for i := 1; i <= n; i++ {
			if _, err := conn.Exec(ctx, "INSERT INTO t VALUES ($1, $1)", i); err != nil {
				written <- err
				return
			}
			if i%300 == 0 {
				time.Sleep(50 * time.Millisecond)
			}
		}
		written <- nil
	}()
	return written
}

// checkOnce waits up to 30 s for rows 1..n to be in the broker, then
// fails unless each is there exactly once.
func checkOnce(t *testing.T, count func() map[string]int, n int, logs func() string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	var ids map[string]int
	for {
		ids = count()
		if len(ids) == n || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	for i := 1; i <= n; i++ {
		if c := ids[fmt.Sprint(i)]; c != 1 {
			t.Fatalf("row %d is in the broker %d times (want exactly once); ingest logs:\n%s", i, c, logs())
		}
	}
	if len(ids) != n {
		t.Fatalf("%d distinct keys, want %d", len(ids), n)
	}
}

// starter returns a function that starts bin with args, its output going
// to logs (guarded by mu).
func starter(t testing.TB, bin string, args []string, logs *bytes.Buffer, mu *sync.Mutex) func() *exec.Cmd {
	return func() *exec.Cmd {
		cmd := exec.Command(bin, args...)
		w := lockedWriter{mu: mu, w: logs}
		cmd.Stdout, cmd.Stderr = w, w
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		return cmd
	}
}

// killThrice kills cmd with SIGKILL and starts it again after down, three
// times: each time once progress has reached another step (or 30 s have
// passed). It returns the running process.
func killThrice(cmd *exec.Cmd, start func() *exec.Cmd, progress func() int, step int, down time.Duration) *exec.Cmd {
	for kill := 1; kill <= 3; kill++ {
		deadline := time.Now().Add(30 * time.Second)
		for progress() < kill*step && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		time.Sleep(down)
		cmd = start()
	}
	return cmd
}

type lockedWriter struct {
	mu *sync.Mutex
	w  *bytes.Buffer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// TestMemoryProjectionKilledResumes kills an ingest serving a memory-mode
// projection with SIGKILL three times while transactions keep changing
// orders and their items, each keeping an order's total equal to the sum
// of its items' quantities, and keeps it down for longer than the
// broker's duplicate window. Every document published must hold that
// invariant (a document mixing two states would not), no event may be
// published twice, and the last document of every order must equal the
// database's.
func TestMemoryProjectionKilledResumes(t *testing.T) {
	t.Parallel() // a process-level test that mostly waits: beside the others (make test's time)
	bin := buildBinary(t)
	pg := pgtest.Start(t, pgtest.Config{})
	pg.Exec("postgres",
		"CREATE TABLE orders (id int PRIMARY KEY, total int NOT NULL)",
		"CREATE TABLE items (id int PRIMARY KEY, order_id int NOT NULL, qty int NOT NULL)",
		"INSERT INTO orders SELECT g, 0 FROM generate_series(1, 20) g",
	)
	cfgFile := filepath.Join(t.TempDir(), "projections.yaml")
	if err := os.WriteFile(cfgFile, []byte(`projections:
  - name: orders
    table: orders
    key: id
    mode: memory
    embed:
      - as: items
        table: items
        on: {order_id: id}
        many: true
        order_by: id
`), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	ns := brokertest.NATS(t)
	b, err := broker.DialJetStream(ctx, broker.JetStreamConfig{NATSConfig: broker.NATSConfig{URL: ns.ClientURL(), Subjects: []string{"db.>"}}, Stream: "CDC", Duplicates: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	port, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	args := []string{"ingest", "--pg", pg.DSN("postgres"), "--listen", fmt.Sprintf("127.0.0.1:%d", port), "--log-level", "info",
		"--broker", "jetstream", "--nats-url", ns.ClientURL(), "--subjects", "db.>", "--stream", "CDC",
		"--config", cfgFile, "--state-dir", t.TempDir(),
		// Down for longer than the duplicate window: the high-water mark
		// alone keeps repeats out. Windows of several transactions: the
		// one open at the mark is made again exactly.
		"--dedup-window", "1s", "--flush-window", "20ms"}
	var logs bytes.Buffer
	var logMu sync.Mutex
	start := starter(t, bin, args, &logs, &logMu)
	cmd := start()
	// Writers: 900 transactions, each keeping total = sum(qty) per order.
	const n = 900
	written := make(chan error, 1)
	go func() {
		conn, err := pgx.Connect(ctx, pg.DSN("postgres"))
		if err != nil {
			written <- err
			return
		}
		defer conn.Close(context.Background())
		tx := func(sqls ...string) error {
			b := &pgx.Batch{}
			b.Queue("BEGIN")
			for _, q := range sqls {
				b.Queue(q)
			}
			b.Queue("COMMIT")
			return conn.SendBatch(ctx, b).Close()
		}
		for i := 1; i <= n; i++ {
			o, o2, q := i%20+1, (i*7)%20+1, i%5+1
			var err error
			switch i % 3 {
			case 0, 1: // a new item
				err = tx(fmt.Sprintf("INSERT INTO items VALUES (%d, %d, %d)", i, o, q),
					fmt.Sprintf("UPDATE orders SET total = total + %d WHERE id = %d", q, o))
			case 2: // move item i-1 to another order
				err = tx(fmt.Sprintf("UPDATE orders SET total = total - (SELECT qty FROM items WHERE id = %d) WHERE id = (SELECT order_id FROM items WHERE id = %d)", i-1, i-1),
					fmt.Sprintf("UPDATE items SET order_id = %d WHERE id = %d", o2, i-1),
					fmt.Sprintf("UPDATE orders SET total = total + (SELECT qty FROM items WHERE id = %d) WHERE id = %d", i-1, o2))
			}
			if err != nil {
				written <- err
				return
			}
			if i%150 == 0 {
				time.Sleep(50 * time.Millisecond)
			}
		}
		written <- nil
	}()
	type doc struct {
		Total int `json:"total"`
		Items []struct {
			ID  int `json:"id"`
			Qty int `json:"qty"`
		} `json:"items"`
	}
	type ev struct {
		ID  string          `json:"id"`
		Op  string          `json:"op"`
		Key int             `json:"key"`
		Doc json.RawMessage `json:"doc"`
	}
	read := func() []ev {
		var out []ev
		_ = b.Replay(ctx, []string{"db.>"}, "", "js:1000000000", func(ms []broker.Message) error {
			for _, m := range ms {
				var e ev
				if err := json.Unmarshal(m.Data, &e); err != nil {
					return err
				}
				out = append(out, e)
			}
			return nil
		})
		return out
	}
	cmd = killThrice(cmd, start, func() int { return len(read()) }, 60, 1500*time.Millisecond)
	defer func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}()
	if err := <-written; err != nil {
		t.Fatal(err)
	}
	// The database's documents.
	conn, err := pgx.Connect(ctx, pg.DSN("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	want := map[int]string{}
	rows, err := conn.Query(ctx, `SELECT o.id, json_build_object('total', o.total, 'items',
		coalesce((SELECT json_agg(json_build_object('id', i.id, 'qty', i.qty) ORDER BY i.id) FROM items i WHERE i.order_id = o.id), '[]'))::text FROM orders o`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id int
		var j string
		if err := rows.Scan(&id, &j); err != nil {
			t.Fatal(err)
		}
		var d doc
		_ = json.Unmarshal([]byte(j), &d)
		nb, _ := json.Marshal(d)
		want[id] = string(nb)
	}
	rows.Close()
	deadline := time.Now().Add(30 * time.Second)
	for {
		evs := read()
		last := map[int]string{}
		seen := map[string]int{}
		var bad []string
		for _, e := range evs {
			seen[e.ID]++
			var d doc
			if err := json.Unmarshal(e.Doc, &d); err != nil {
				t.Fatal(err)
			}
			sum := 0
			for _, it := range d.Items {
				sum += it.Qty
			}
			if sum != d.Total {
				bad = append(bad, fmt.Sprintf("event %s: order %d total %d, items sum to %d: %s", e.ID, e.Key, d.Total, sum, e.Doc))
			}
			nb, _ := json.Marshal(d)
			last[e.Key] = string(nb)
		}
		if len(bad) > 0 {
			logMu.Lock()
			t.Fatalf("inconsistent documents:\n%s\nlogs:\n%s", strings.Join(bad[:min(5, len(bad))], "\n"), logs.String())
		}
		for id, c := range seen {
			if c != 1 {
				t.Fatalf("event %s published %d times", id, c)
			}
		}
		done := true
		for id, w := range want {
			if last[id] != w {
				done = false
				if time.Now().After(deadline) {
					logMu.Lock()
					t.Fatalf("order %d: last document %s, database %s\nlogs:\n%s", id, last[id], w, logs.String())
				}
			}
		}
		if done {
			logMu.Lock()
			t.Logf("%d events, %d distinct documents, all consistent; high-water marks:\n%s", len(evs), len(last), grepLines(logs.String(), "high-water mark"))
			logMu.Unlock()
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// grepLines is the lines of logs that contain s.
func grepLines(logs, s string) string {
	var out []string
	for _, l := range strings.Split(logs, "\n") {
		if strings.Contains(l, s) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// procLogs gathers the output of the processes a test starts.
type procLogs struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

// starter is the package's starter, writing into l.
func (l *procLogs) starter(t testing.TB, bin string, args []string) func() *exec.Cmd {
	return starter(t, bin, args, &l.buf, &l.mu)
}

// dump returns everything written so far.
func (l *procLogs) dump() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// listenAddr is a free loopback address for a process's --listen.
func listenAddr(t testing.TB) string {
	t.Helper()
	port, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("127.0.0.1:%d", port)
}
