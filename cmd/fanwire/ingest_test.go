package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/fanwire/fanwire/broker"
	"github.com/fanwire/fanwire/broker/brokertest"
	"github.com/fanwire/fanwire/cdc/pgtest"
	"github.com/jackc/pgx/v5"
)

// buildBinary builds fanwire into a temp dir once per test.
func buildBinary(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "fanwire")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// TestIngestKilledMidStreamPublishesEveryChangeOnce kills the ingest
// process with SIGKILL while single-row transactions keep committing, then
// starts it again: every committed change is in the broker exactly once
// (the slot re-sends what was not confirmed; the broker drops the ids it
// has), on JetStream and on Redis Streams.
func TestIngestKilledMidStreamPublishesEveryChangeOnce(t *testing.T) {
	bin := buildBinary(t)
	for _, kind := range []string{"jetstream", "redis"} {
		t.Run(kind, func(t *testing.T) {
			pg := pgtest.Start(t, pgtest.Config{})
			pg.Exec("postgres", "CREATE TABLE t (id int PRIMARY KEY, v int)")
			var args []string
			var d broker.Durable
			until := "js:1000000000" // past every event: a replay of everything
			if kind == "redis" {
				until = "rs:99999999999999-0"
			}
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			switch kind {
			case "jetstream":
				ns := brokertest.NATS(t)
				args = []string{"--broker", "jetstream", "--nats-url", ns.ClientURL(), "--subjects", "db.>", "--stream", "CDC"}
				b, err := broker.DialJetStream(ctx, broker.JetStreamConfig{NATSConfig: broker.NATSConfig{URL: ns.ClientURL(), Subjects: []string{"db.>"}}, Stream: "CDC"})
				if err != nil {
					t.Fatal(err)
				}
				defer b.Close()
				d = b
			case "redis":
				url := "redis://" + brokertest.Redis(t)
				args = []string{"--broker", "redis", "--redis-url", url, "--stream", "cdc"}
				b, err := broker.DialRedis(ctx, broker.RedisConfig{URL: url, Stream: "cdc"})
				if err != nil {
					t.Fatal(err)
				}
				defer b.Close()
				d = b
			}
			port, err := freePort()
			if err != nil {
				t.Fatal(err)
			}
			args = append([]string{"ingest", "--pg", pg.DSN("postgres"), "--listen", fmt.Sprintf("127.0.0.1:%d", port), "--log-level", "warn"}, args...)
			var logs bytes.Buffer
			var logMu sync.Mutex
			start := func() *exec.Cmd {
				cmd := exec.Command(bin, args...)
				w := lockedWriter{mu: &logMu, w: &logs}
				cmd.Stdout, cmd.Stderr = w, w
				if err := cmd.Start(); err != nil {
					t.Fatal(err)
				}
				return cmd
			}
			cmd := start()
			// Writers: 1,500 single-row transactions, while the ingest is
			// killed and started again.
			const n = 1500
			written := make(chan error, 1)
			go func() {
				conn, err := pgx.Connect(ctx, pg.DSN("postgres"))
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
			count := func() map[string]int {
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
			// Kill it once events flow, then twice more.
			for kill := 0; kill < 3; kill++ {
				deadline := time.Now().Add(30 * time.Second)
				for len(count()) < (kill+1)*300 && time.Now().Before(deadline) {
					time.Sleep(20 * time.Millisecond)
				}
				_ = cmd.Process.Kill()
				_ = cmd.Wait()
				cmd = start()
			}
			defer func() {
				_ = cmd.Process.Kill()
				_ = cmd.Wait()
			}()
			if err := <-written; err != nil {
				t.Fatal(err)
			}
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
					logMu.Lock()
					t.Fatalf("row %d is in the broker %d times (want exactly once); ingest logs:\n%s", i, c, logs.String())
				}
			}
			if len(ids) != n {
				t.Fatalf("%d distinct keys, want %d", len(ids), n)
			}
		})
	}
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
