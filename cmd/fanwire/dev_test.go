package main

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/fanwire/fanwire/cdc/pgtest"
)

func TestDevSubjects(t *testing.T) {
	for _, tc := range []struct {
		prefix string
		want   []string
	}{
		{"db", []string{"db.>", "app.>", "demo.>", "room.>"}},
		{"pg", []string{"pg.>", "app.>", "demo.>", "room.>"}},
		{"app", []string{"app.>", "demo.>", "room.>"}}, // not twice: the stream's patterns may not overlap
	} {
		if got := devSubjects(tc.prefix); !slices.Equal(got, tc.want) {
			t.Errorf("devSubjects(%q) = %q, want %q", tc.prefix, got, tc.want)
		}
	}
	for _, tc := range []struct {
		given   []string
		prefix  string
		want    []string
		wantErr string
	}{
		{given: []string{"chat.>"}, prefix: "db", want: []string{"chat.>", "db.>"}},
		{given: []string{"db.>", "chat.>"}, prefix: "db", want: []string{"db.>", "chat.>"}},
		{given: []string{"*.>"}, prefix: "pg", want: []string{"*.>"}},
		{given: []string{"chat.>"}, prefix: "pg", want: []string{"chat.>", "pg.>"}},
		{given: []string{"db.orders.>"}, prefix: "db", wantErr: `--subjects: "db.orders.>" covers part of the ingest's db.> (--prefix db)`},
		{given: []string{"a..b"}, prefix: "db", wantErr: "--subjects: bad pattern"},
	} {
		got, err := withIngestSpace(tc.given, tc.prefix)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("withIngestSpace(%q, %q) = %q, %v; want an error with %q", tc.given, tc.prefix, got, err, tc.wantErr)
			}
			continue
		}
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("withIngestSpace(%q, %q) = %q, %v; want %q", tc.given, tc.prefix, got, err, tc.want)
		}
	}
}

// TestLockDataDir: one lock per directory, also within one process (flock
// locks belong to an open file, not to the process), free again once
// unlocked.
func TestLockDataDir(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	unlock, err := lockDataDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lockDataDir(dir); err == nil || !strings.Contains(err.Error(), "is in use by another fanwire dev (pid ") {
		t.Fatalf("second lock: %v, want in use by another fanwire dev (pid …)", err)
	}
	unlock()
	unlock, err = lockDataDir(dir)
	if err != nil {
		t.Fatalf("lock after unlock: %v", err)
	}
	unlock()
}

// TestDevKeepsHistory runs `fanwire dev` as a user does, in a directory of
// its own with no flags but the address: it runs on JetStream and says so,
// keeps what was published across a restart, refuses a second dev on its
// data directory, and `--broker nats` runs Core NATS as before.
func TestDevKeepsHistory(t *testing.T) {
	bin := buildBinary(t)
	dir := t.TempDir()
	listen := listenAddr(t)
	env := []string{"FANWIRE_LISTEN=" + listen, "FANWIRE_LOG_LEVEL=warn"}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	dev := startDev(t, dir, env, listen, bin+" dev")
	banner := dev.banner()
	for _, want := range []string{
		"open http://" + listen + "/ in a browser for the console",
		"broker: JetStream, stream FANWIRE on the embedded NATS server nats://127.0.0.1:",
		"store: " + filepath.Join(dir, ".fanwire", "nats") + " (events kept 24h or 1 GiB, across restarts)",
		"subjects: db.>,app.>,demo.>,room.> (the stream keeps these",
	} {
		if !strings.Contains(banner, want) {
			t.Errorf("banner lacks %q:\n%s", want, banner)
		}
	}
	if got := httpPublish(t, listen, `{"subject":"demo.hello","data":{"hi":1}}`); got != `{"published":1,"cursors":["js:1"]}` {
		t.Fatalf("publish answered %s", got)
	}
	if got := httpPublish(t, listen, `{"subject":"chat.hello","data":{"hi":1}}`); !strings.Contains(got, `"rule":"subject_space"`) {
		t.Fatalf("publish outside dev's subjects answered %s, want a refusal by subject_space", got)
	}

	// A second dev on the same directory stops before it starts anything.
	second := exec.Command(bin, "dev", "--listen", listenAddr(t))
	second.Dir = dir
	out, err := second.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 ||
		!strings.Contains(string(out), "fanwire dev: --data-dir ./.fanwire is in use by another fanwire dev (pid ") {
		t.Fatalf("second dev on the same --data-dir: %v\n%s", err, out)
	}

	dev.interrupt()
	dev = startDev(t, dir, env, listen, bin+" dev")
	got := subscribeFromFirst(ctx, t, listen, "demo.*")
	if want := []string{`event demo.hello js:1 {"hi":1}`, "synced js:1"}; !slices.Equal(got, want) {
		t.Fatalf("after a restart, demo.* from first gives %q, want %q", got, want)
	}
	dev.interrupt()

	dev = startDev(t, dir, env, listen, bin+" dev --broker nats")
	banner = dev.banner()
	if !strings.Contains(banner, "broker: Core NATS on the embedded NATS server nats://127.0.0.1:") || !strings.Contains(banner, "subjects: >\n") {
		t.Errorf("--broker nats banner:\n%s", banner)
	}
	if got := httpPublish(t, listen, `{"subject":"chat.hello","data":{"hi":1}}`); got != `{"published":1}` {
		t.Fatalf("publish on Core NATS answered %s", got)
	}
	if got := subscribeFromFirst(ctx, t, listen, "demo.*"); len(got) != 1 || !strings.HasPrefix(got[0], "error bad_cursor") {
		t.Fatalf("Core NATS, demo.* from first gives %q, want bad_cursor", got)
	}
	dev.interrupt()
}

// devProc is a `fanwire dev` process started by sh from a command line,
// as a shell runs the README's.
type devProc struct {
	t      testing.TB
	cmd    *exec.Cmd
	logs   procLogs
	exited chan struct{} // closed once cmd has exited
}

// startDev runs line with sh in dir, with env added to the test's, and
// waits until listen answers /readyz; t.Cleanup kills what is left.
func startDev(t testing.TB, dir string, env []string, listen, line string) *devProc {
	t.Helper()
	p := &devProc{t: t, exited: make(chan struct{})}
	p.cmd = exec.Command("sh", "-c", "exec "+line) // exec: the signals reach dev, as from a terminal
	p.cmd.Dir = dir
	p.cmd.Env = append(os.Environ(), env...)
	w := lockedWriter{mu: &p.logs.mu, w: &p.logs.buf}
	p.cmd.Stdout, p.cmd.Stderr = w, w
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { // owned by p: interrupt and the cleanup wait for it
		_ = p.cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		<-p.exited
	})
	deadline := time.Now().Add(30 * time.Second)
	for !readyWithin(listen, 0) {
		select {
		case <-p.exited:
			t.Fatalf("%s exited before it was ready: %s\n%s", line, p.cmd.ProcessState, p.logs.dump())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not ready on %s within 30s:\n%s", line, listen, p.logs.dump())
		}
	}
	return p
}

// banner waits until the process has printed its start-up banner and
// returns it: from "fanwire is up" to the blank line that ends it.
func (p *devProc) banner() string {
	p.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		out := p.logs.dump()
		if i := strings.Index(out, "  fanwire is up"); i >= 0 {
			if j := strings.Index(out[i:], "\n\n"); j >= 0 {
				return out[i : i+j+1]
			}
		}
		if time.Now().After(deadline) {
			p.t.Fatalf("no banner within 10s:\n%s", out)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// interrupt stops the process as Ctrl-C does and waits until it has
// exited, which must be with 0.
func (p *devProc) interrupt() {
	p.t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGINT); err != nil {
		p.t.Fatal(err)
	}
	select {
	case <-p.exited:
	case <-time.After(20 * time.Second):
		p.t.Fatalf("dev did not exit within 20s of SIGINT:\n%s", p.logs.dump())
	}
	if !p.cmd.ProcessState.Success() {
		p.t.Fatalf("dev exited with %s after SIGINT:\n%s", p.cmd.ProcessState, p.logs.dump())
	}
}

// httpPublish posts body to listen's /api/publish without a credential
// and returns the answer.
func httpPublish(t testing.TB, listen, body string) string {
	t.Helper()
	resp, err := http.Post("http://"+listen+"/api/publish", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// subscribeFromFirst subscribes to pattern from the first event on a new
// connection and returns what it gets until synced or an error: "event
// <subject> <cursor> <data>", "synced <cursor>", "error <code> …".
func subscribeFromFirst(ctx context.Context, t testing.TB, listen, pattern string) []string {
	t.Helper()
	return readFromFirst(ctx, t, listen, pattern, func(m string) bool { return !strings.HasPrefix(m, "event ") })
}

// firstEvent subscribes to pattern from the first event on a new
// connection and returns the first event, stored or live.
func firstEvent(ctx context.Context, t testing.TB, listen, pattern string) string {
	t.Helper()
	got := readFromFirst(ctx, t, listen, pattern, func(m string) bool { return !strings.HasPrefix(m, "synced ") })
	return got[len(got)-1]
}

// readFromFirst subscribes to pattern from the first event and reads
// until last says a message is the last wanted.
func readFromFirst(ctx context.Context, t testing.TB, listen, pattern string, last func(string) bool) []string {
	t.Helper()
	c, _, err := websocket.Dial(ctx, "ws://"+listen+"/ws", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	sub, _ := json.Marshal(map[string]string{"type": "subscribe", "id": "s1", "subject": pattern, "from": "first"})
	if err := c.Write(ctx, websocket.MessageText, sub); err != nil {
		t.Fatal(err)
	}
	var got []string
	for {
		_, b, err := c.Read(ctx)
		if err != nil {
			t.Fatalf("read: %v (so far %q)", err, got)
		}
		for _, line := range strings.Split(string(b), "\n") { // a frame may hold several messages
			var m struct {
				Type, Subject, Cursor, Code, Message string
				Data                                 json.RawMessage
			}
			if err := json.Unmarshal([]byte(line), &m); err != nil {
				t.Fatalf("message %q: %v", line, err)
			}
			switch m.Type {
			case "event":
				got = append(got, "event "+m.Subject+" "+m.Cursor+" "+string(m.Data))
			case "synced":
				got = append(got, "synced "+m.Cursor)
			case "error":
				return append(got, "error "+m.Code+" "+m.Message)
			default:
				continue
			}
			if last(got[len(got)-1]) {
				return got
			}
		}
	}
}

// TestDevNewStreamPublishesEveryRow: dev --pg on a new store (a data
// directory removed, or one of an earlier Core NATS dev) publishes every
// row again, although the slot it left in PostgreSQL has published them
// already: a view on the new stream would miss every row that does not
// change.
func TestDevNewStreamPublishesEveryRow(t *testing.T) {
	bin := buildBinary(t)
	pg := pgtest.Start(t, pgtest.Config{})
	pg.Exec("postgres", "CREATE TABLE orders (id int PRIMARY KEY, status text)", "INSERT INTO orders VALUES (1, 'new')")
	dir := t.TempDir()
	listen := listenAddr(t)
	env := []string{"FANWIRE_LISTEN=" + listen, "FANWIRE_LOG_LEVEL=warn", "FANWIRE_PG=" + pg.DSN("postgres")}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for run := range 2 {
		dev := startDev(t, dir, env, listen, bin+" dev")
		// Ready before the bootstrap: the row comes once it has run.
		got := firstEvent(ctx, t, listen, "db.orders.*")
		if !strings.HasPrefix(got, "event db.orders.1 js:") || !strings.Contains(got, `"doc":{"id":1,"status":"new"}`) {
			t.Fatalf("run %d: db.orders.* from first gives %q, want the row", run, got)
		}
		dev.interrupt()
		if err := os.RemoveAll(filepath.Join(dir, ".fanwire", "nats")); err != nil {
			t.Fatal(err)
		}
	}
}
