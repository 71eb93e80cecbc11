// Package pgtest starts real PostgreSQL clusters for tests, the way
// net/http/httptest starts real HTTP servers: initdb into a fresh directory,
// wal_level=logical, a free loopback port, stopped and removed by
// t.Cleanup. It fails the test loudly when PostgreSQL is missing; it never
// skips.
package pgtest

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// Server is one running PostgreSQL cluster.
type Server struct {
	t        testing.TB
	bin      string // the server binaries' directory
	dir      string // owns data/, sock/ and postgres.log
	port     int
	settings []string // -c name=value
	cred     *syscall.Credential
	cmd      *exec.Cmd
	exited   chan struct{} // closed when cmd has been waited for
}

// Config adjusts a cluster. The zero value is a logical-replication-ready
// cluster with PostgreSQL's defaults otherwise.
type Config struct {
	// Settings are extra server settings, e.g. "logical_decoding_work_mem":
	// "64kB" to make small transactions stream.
	Settings map[string]string
}

// Start starts a cluster with cfg and returns it once it accepts
// connections.
func Start(t testing.TB, cfg Config) *Server {
	t.Helper()
	if testing.Short() {
		t.Skip("-short (make test-quick) leaves out the tests that start a PostgreSQL cluster: make test runs them")
	}
	s := &Server{t: t, bin: binDir(t)}
	dir, err := os.MkdirTemp("", "fanwire-pgtest-")
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	s.dir = dir
	t.Cleanup(func() {
		s.stop(syscall.SIGQUIT) // immediate shutdown: the data is thrown away
		_ = os.RemoveAll(dir)
	})
	// initdb and postgres refuse to run as root: run them as "postgres" on
	// directories it owns (CI runs as root).
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			t.Fatalf("pgtest: running as root needs the postgres user (apt-get install postgresql creates it): %v", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		s.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	}
	for _, d := range []string{dir, filepath.Join(dir, "sock")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatalf("pgtest: %v", err)
		}
		if s.cred != nil {
			if err := os.Chown(d, int(s.cred.Uid), int(s.cred.Gid)); err != nil {
				t.Fatalf("pgtest: %v", err)
			}
		}
	}
	initdb := s.command("initdb", "-D", s.dataDir(), "-U", "postgres", "--auth=trust", "--no-sync", "-E", "UTF8", "--locale=C")
	if out, err := initdb.CombinedOutput(); err != nil {
		t.Fatalf("pgtest: initdb: %v\n%s", err, out)
	}
	s.settings = []string{
		"listen_addresses=127.0.0.1",
		"wal_level=logical",
		"max_wal_senders=10",
		"max_replication_slots=10",
		"fsync=off", // a test cluster need not survive a power cut
		"full_page_writes=off",
	}
	keys := make([]string, 0, len(cfg.Settings))
	for k := range cfg.Settings {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		s.settings = append(s.settings, k+"="+cfg.Settings[k])
	}
	s.port = freePort(t)
	s.Start()
	return s
}

// binDir finds the newest installed server's binaries.
func binDir(t testing.TB) string {
	t.Helper()
	if p, err := exec.LookPath("pg_config"); err == nil {
		if out, err := exec.Command(p, "--bindir").Output(); err == nil {
			d := strings.TrimSpace(string(out))
			if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil {
				return d
			}
		}
	}
	m, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	if len(m) == 0 {
		t.Fatal("pgtest: PostgreSQL server binaries not found (no initdb under /usr/lib/postgresql/*/bin): run `make test`, which installs them, or apt-get install postgresql")
	}
	slices.SortFunc(m, func(a, b string) int { return version(a) - version(b) })
	return filepath.Dir(m[len(m)-1])
}

func version(initdb string) int {
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(filepath.Dir(initdb))))
	return v
}

func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("pgtest: free port: %v", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func (s *Server) dataDir() string { return filepath.Join(s.dir, "data") }

func (s *Server) command(name string, args ...string) *exec.Cmd {
	cmd := exec.Command(filepath.Join(s.bin, name), args...)
	if s.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred}
	}
	return cmd
}

// Start starts the (stopped) server again on the same port and data, and
// waits until it accepts connections.
func (s *Server) Start() {
	s.t.Helper()
	// After a SIGKILL the old postmaster's children take a moment to notice
	// and exit; until they have, a new postmaster refuses to start ("shared
	// memory block is still in use"): try again for a while.
	for try := 0; ; try++ {
		if s.start(try < 100) {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// start starts postgres; when it exits at once because the old cluster's
// processes still hold its shared memory and retry is set, it returns
// false.
func (s *Server) start(retry bool) bool {
	s.t.Helper()
	args := []string{"-D", s.dataDir(), "-p", strconv.Itoa(s.port), "-k", filepath.Join(s.dir, "sock")}
	for _, kv := range s.settings {
		args = append(args, "-c", kv)
	}
	cmd := s.command("postgres", args...)
	logf, err := os.OpenFile(filepath.Join(s.dir, "postgres.log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		s.t.Fatalf("pgtest: %v", err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		s.t.Fatalf("pgtest: start postgres: %v", err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		logf.Close()
		close(exited)
	}()
	s.cmd, s.exited = cmd, exited
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		conn, err := pgx.Connect(ctx, s.DSN("postgres"))
		cancel()
		if err == nil {
			_ = conn.Close(context.Background())
			return true
		}
		select {
		case <-exited:
			s.cmd = nil
			if retry && strings.Contains(s.Log(), "is still in use") {
				return false
			}
			s.t.Fatalf("pgtest: postgres exited at start:\n%s", s.Log())
		default:
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("pgtest: postgres not ready after 30s: %v\n%s", err, s.Log())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Stop shuts the server down cleanly (a fast shutdown: connections are
// closed, the WAL is flushed).
func (s *Server) Stop() { s.stop(syscall.SIGINT) }

// Kill kills the server with SIGKILL, as a crash: the next Start recovers
// from the WAL.
func (s *Server) Kill() { s.stop(syscall.SIGKILL) }

// Restart stops the server cleanly and starts it again.
func (s *Server) Restart() {
	s.t.Helper()
	s.Stop()
	s.Start()
}

func (s *Server) stop(sig syscall.Signal) {
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Signal(sig)
	select {
	case <-s.exited:
	case <-time.After(30 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.exited
	}
	s.cmd = nil
}

// Port is the server's TCP port.
func (s *Server) Port() int { return s.port }

// DSN is a connection string for database db as the superuser postgres.
func (s *Server) DSN(db string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", s.port, db)
}

// Exec runs SQL statements on database db and fails the test on an error.
func (s *Server) Exec(db string, sql ...string) {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, s.DSN(db))
	if err != nil {
		s.t.Fatalf("pgtest: connect: %v", err)
	}
	defer conn.Close(context.Background())
	for _, q := range sql {
		if _, err := conn.Exec(ctx, q); err != nil {
			s.t.Fatalf("pgtest: %s: %v", q, err)
		}
	}
}

// Log returns the server's log so far.
func (s *Server) Log() string {
	b, _ := os.ReadFile(filepath.Join(s.dir, "postgres.log"))
	return string(b)
}

// OrdersDataSet is the projection benchmarks' data set (the ingest issue's):
// customers 10k, orders 100k (order i to customer 1 + i % 10,000), items
// 300k (items 1–3 to order 1, 4–6 to order 2, …). Items and customers send
// their old rows (REPLICA IDENTITY FULL); the join columns are indexed.
var OrdersDataSet = []string{
	"CREATE TABLE customers (id int PRIMARY KEY, name text, email text)",
	"CREATE TABLE orders (id int PRIMARY KEY, customer_id int, status text, total numeric(12,2), created_at timestamptz)",
	"CREATE TABLE order_items (id int PRIMARY KEY, order_id int, sku text, qty int, price numeric(10,2))",
	"INSERT INTO customers SELECT i, 'Customer '||i, 'customer'||i||'@example.com' FROM generate_series(1, 10000) i",
	"INSERT INTO orders SELECT i, 1 + i % 10000, 'new', (i % 1000) + 0.99, '2026-11-30 12:00:00+00'::timestamptz + i * interval '1 second' FROM generate_series(1, 100000) i",
	"INSERT INTO order_items SELECT i, (i + 2) / 3, 'SKU-'||(i % 5000), 1 + i % 5, (i % 200) + 0.5 FROM generate_series(1, 300000) i",
	"CREATE INDEX ON orders (customer_id)",
	"CREATE INDEX ON order_items (order_id)",
	"ALTER TABLE order_items REPLICA IDENTITY FULL",
	"ALTER TABLE customers REPLICA IDENTITY FULL",
	"VACUUM ANALYZE",
}
