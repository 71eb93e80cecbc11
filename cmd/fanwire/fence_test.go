package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fanwire/fanwire/cdc/pgtest"
)

// TestFrozenLeaderPublishesNothingAfterWaking: a leader frozen (SIGSTOP)
// while transactions commit loses its lock to the standby, which takes
// over and publishes; when the old leader wakes up (SIGCONT) it still
// holds what it had decoded, and its socket what PostgreSQL had sent. It
// must publish none of it: the events are the new leader's now, and a
// stale copy stored after them would be a duplicate (the duplicate window
// here, 5 s, is longer than a takeover but shorter than the freeze, so a
// stale copy is not dropped) and out of order. Before the publisher asked
// the lock's lease, the woken leader published until its keeper's next
// ping noticed the lost lock.
func TestFrozenLeaderPublishesNothingAfterWaking(t *testing.T) {
	t.Parallel() // a process-level test that mostly waits: beside the others (make test's time)
	bin := buildBinary(t)
	forEachIngestBroker(t, 90*time.Second, 5*time.Second, func(ctx context.Context, t *testing.T, pg *pgtest.Server, bargs []string, count func() map[string]int) {
		var logs bytes.Buffer
		var logMu sync.Mutex
		dump := func() string {
			logMu.Lock()
			defer logMu.Unlock()
			return logs.String()
		}
		var addrs [2]string
		var cmds [2]*exec.Cmd
		for i := range cmds {
			port, err := freePort()
			if err != nil {
				t.Fatal(err)
			}
			addrs[i] = fmt.Sprintf("127.0.0.1:%d", port)
			args := append([]string{"ingest", "--pg", pg.DSN("postgres"), "--listen", addrs[i], "--log-level", "info", "--leader-timeout", "3s"}, bargs...)
			cmds[i] = starter(t, bin, args, &logs, &logMu)()
			want := "ready"
			if i == 1 {
				want = "standby"
			}
			waitIngest(t, addrs[i], want, dump)
		}
		defer func() {
			for _, c := range cmds {
				_ = c.Process.Signal(syscall.SIGCONT)
				_ = c.Process.Kill()
				_ = c.Wait()
			}
		}()
		const n = 3000
		written := writeRows(ctx, pg.DSN("postgres"), n)
		for deadline := time.Now().Add(30 * time.Second); len(count()) < 400 && time.Now().Before(deadline); {
			time.Sleep(5 * time.Millisecond)
		}
		// Frozen while rows keep committing: it has WAL in flight.
		if err := cmds[0].Process.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		frozen := time.Now()
		atFreeze := len(count())
		waitIngest(t, addrs[1], "ready", dump)
		for deadline := time.Now().Add(30 * time.Second); len(count()) <= atFreeze && time.Now().Before(deadline); {
			time.Sleep(10 * time.Millisecond)
		}
		if len(count()) <= atFreeze {
			t.Fatalf("the new leader published nothing; logs:\n%s", dump())
		}
		// Past the duplicate window after the takeover, and past
		// JetStream's 10 s batch timeout (an atomic batch the leader was
		// sending when it froze is dropped, not committed on waking), then
		// wake it up.
		time.Sleep(time.Until(frozen.Add(12 * time.Second)))
		if err := cmds[0].Process.Signal(syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
		waitIngest(t, addrs[0], "standby", dump)
		if err := <-written; err != nil {
			t.Fatal(err)
		}
		checkOnce(t, count, n, dump)
		t.Logf("the old leader: %s", lastLine(dump(), "lost the slot's lock"))
	})
}

// waitIngest polls an ingest process until it is "ready" (/readyz 200) or
// "standby" (/metrics says so), for 30 s.
func waitIngest(t *testing.T, addr, what string, logs func() string) {
	t.Helper()
	path := "/readyz"
	if what == "standby" {
		path = "/metrics"
	}
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		resp, err := http.Get("http://" + addr + path)
		if err != nil {
			continue
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if what == "ready" && resp.StatusCode == http.StatusOK ||
			what == "standby" && strings.Contains(string(body), "\nfanwire_ingest_standby 1\n") && strings.Contains(string(body), "\nfanwire_ingest_ready 0\n") {
			return
		}
	}
	t.Fatalf("ingest on %s never became %s; logs:\n%s", addr, what, logs())
}

// lastLine is the last line of logs that contains s ("" if none).
func lastLine(logs, s string) string {
	lines := strings.Split(logs, "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if strings.Contains(lines[i], s) {
			return lines[i]
		}
	}
	return ""
}
