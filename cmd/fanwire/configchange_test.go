package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fanwire/fanwire/cdc/pgtest"
	"github.com/jackc/pgx/v5"
)

// TestConfigChangeAcrossRestart: an ingest killed (kill -9) while rows keep
// changing comes back with another configuration: a table it published
// dropped from --tables and another added, its projections reordered and
// one added. Nothing is published twice (every id once), and nothing is
// lost: every table and projection it publishes has each row's every
// change since it started publishing it, in order, ending with the row as
// it is, the added table's and projection's rows included. Before,
// reordering projections or changing --tables shifted the ids below the
// high-water mark (events skipped, never stored), the added table was
// refused until added to the publication by hand and then had only its
// changes, and the added projection only the documents that changed.
func TestConfigChangeAcrossRestart(t *testing.T) {
	t.Parallel() // a process-level test that mostly waits: beside the others (make test's time)
	bin := buildBinary(t)
	for _, kind := range []string{"jetstream", "redis"} {
		t.Run(kind, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
			defer cancel()
			const keys = 20
			pg := pgtest.Start(t, pgtest.Config{})
			for _, tb := range []string{"a", "b", "c"} {
				pg.Exec("postgres", fmt.Sprintf("CREATE TABLE %s (id int PRIMARY KEY, v int)", tb),
					fmt.Sprintf("INSERT INTO %s SELECT g, 0 FROM generate_series(1, %d) g", tb, keys))
			}
			dir := t.TempDir()
			writeConfig := func(name string, projs ...string) string {
				var b strings.Builder
				b.WriteString("projections:\n")
				for _, p := range projs {
					name, table, _ := strings.Cut(p, ":")
					fmt.Fprintf(&b, "  - {name: %s, table: %s, key: id}\n", name, table)
				}
				path := filepath.Join(dir, name)
				if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
					t.Fatal(err)
				}
				return path
			}
			first := writeConfig("first.yaml", "zeta:a", "alpha:b")
			second := writeConfig("second.yaml", "alpha:b", "zeta:a", "mid:c")
			b := newRestartableBroker(ctx, t, kind, time.Second)
			var logs procLogs
			dump := logs.dump
			addr := listenAddr(t)
			ingest := func(tables, config string) func() *os.Process {
				args := append([]string{"ingest", "--pg", pg.DSN("postgres"), "--listen", addr, "--log-level", "info",
					"--tables", tables, "--config", config, "--state-dir", dir}, b.args...)
				start := logs.starter(t, bin, args)
				return func() *os.Process { return start().Process }
			}
			stop := make(chan struct{})
			written := make(chan error, 1)
			go func() { written <- updateRandomly(ctx, pg.DSN("postgres"), []string{"a", "b", "c"}, keys, stop) }()
			waitStored := func(n int) {
				for deadline := time.Now().Add(30 * time.Second); len(b.stored(ctx, t)) < n && time.Now().Before(deadline); {
					time.Sleep(10 * time.Millisecond)
				}
			}
			p := ingest("a,b", first)()
			waitIngest(t, addr, "ready", dump)
			waitStored(400)
			_ = p.Kill()
			_, _ = p.Wait()
			for round := 1; round <= 2; round++ {
				p = ingest("a,c", second)()
				waitIngest(t, addr, "ready", dump)
				waitStored(400 + 600*round)
				_ = p.Kill()
				_, _ = p.Wait()
			}
			p = ingest("a,c", second)()
			defer func() {
				_ = p.Kill()
				_, _ = p.Wait()
			}()
			waitIngest(t, addr, "ready", dump)
			close(stop)
			if err := <-written; err != nil {
				t.Fatal(err)
			}
			final := map[string]map[int]int{}
			conn, err := pgx.Connect(ctx, pg.DSN("postgres"))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close(context.Background())
			for _, tb := range []string{"a", "b", "c"} {
				final[tb] = map[int]int{}
				rows, err := conn.Query(ctx, "SELECT id, v FROM "+tb)
				if err != nil {
					t.Fatal(err)
				}
				for rows.Next() {
					var id, v int
					_ = rows.Scan(&id, &v)
					final[tb][id] = v
				}
				rows.Close()
			}
			// Subjects and the table whose rows they carry, to the end.
			complete := map[string]string{"db.a.": "a", "db.c.": "c", "db.zeta.": "a", "db.alpha.": "b", "db.mid.": "c"}
			var evs []storedEvent
			caughtUp := func() bool {
				last := lastValues(t, evs)
				for prefix, tb := range complete {
					for k, v := range final[tb] {
						if last[prefix][k] != v {
							return false
						}
					}
				}
				return true
			}
			for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
				evs = b.stored(ctx, t)
				if caughtUp() {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("not every row's last value is published after 30s: %v; logs:\n%s", lastValues(t, evs), dump())
				}
			}
			ids := map[string]int{}
			for i, e := range evs {
				var ev struct{ ID string }
				_ = json.Unmarshal(e.Data, &ev)
				if j, dup := ids[ev.ID]; dup {
					t.Fatalf("event %d (%s) has the id of event %d: %s; logs:\n%s", i, e.Subject, j, ev.ID, dump())
				}
				ids[ev.ID] = i
			}
			// Table events: a row's insert (its bootstrap), then each update.
			for _, prefix := range []string{"db.a.", "db.b.", "db.c."} {
				seen := map[int]int{}
				for _, e := range evs {
					if !strings.HasPrefix(e.Subject, prefix) {
						continue
					}
					var ev struct {
						Op  string
						Key int
						Doc struct{ V int }
					}
					_ = json.Unmarshal(e.Data, &ev)
					prev, ok := seen[ev.Key]
					if !ok && ev.Op != "insert" || ok && ev.Doc.V != prev+1 {
						t.Fatalf("%s%d: %s v %d after %d (seen: %v): a gap, a repeat or out of order; logs:\n%s", prefix, ev.Key, ev.Op, ev.Doc.V, prev, ok, dump())
					}
					seen[ev.Key] = ev.Doc.V
				}
				if len(seen) != keys {
					t.Fatalf("%s: events of %d rows, want %d", prefix, len(seen), keys)
				}
			}
			t.Logf("%d events, each id once; every row's changes in order to its last value on a, c, zeta, alpha and mid; marks: %s", len(evs), grepLines(dump(), "past the high-water mark"))
		})
	}
}

// lastValues maps each subject prefix to each key's last v in evs.
func lastValues(t *testing.T, evs []storedEvent) map[string]map[int]int {
	out := map[string]map[int]int{}
	for _, e := range evs {
		i := strings.LastIndexByte(e.Subject, '.')
		prefix := e.Subject[:i+1]
		var ev struct {
			Key int
			Doc struct{ V int }
		}
		if err := json.Unmarshal(e.Data, &ev); err != nil {
			t.Fatal(err)
		}
		if out[prefix] == nil {
			out[prefix] = map[int]int{}
		}
		out[prefix][ev.Key] = ev.Doc.V
	}
	return out
}

// updateRandomly adds 1 to a random row of a random table, one row a
// transaction, until stop.
func updateRandomly(ctx context.Context, dsn string, tables []string, keys int, stop <-chan struct{}) error {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	rng := rand.New(rand.NewPCG(7, 8))
	for i := 0; ; i++ {
		select {
		case <-stop:
			return nil
		default:
		}
		if _, err := conn.Exec(ctx, "UPDATE "+tables[rng.IntN(len(tables))]+" SET v = v + 1 WHERE id = $1", 1+rng.IntN(keys)); err != nil {
			return err
		}
		if i%20 == 0 {
			time.Sleep(5 * time.Millisecond)
		}
	}
}
