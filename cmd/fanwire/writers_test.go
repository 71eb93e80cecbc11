package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fanwire/fanwire/cdc/pgtest"
	"github.com/jackc/pgx/v5"
)

// TestTwoIngestsOnOnePrefix: two ingests on one database, each on a slot
// of its own, both with the default prefix and into one stream, as a user
// naturally configures them: A publishes orders, B customers, whose rows
// keep changing. A is stopped with SIGTERM while 600 order updates
// commit, kept down past the duplicate window, and started again: every
// change of both is in the broker once, in order. Before, A took B's last
// event as its own high-water mark and skipped (and confirmed) every
// change up to it: none of the 600 were published. A third ingest that
// would publish B's subjects is refused at start, naming both.
func TestTwoIngestsOnOnePrefix(t *testing.T) {
	t.Parallel() // a process-level test that mostly waits: beside the others (make test's time)
	bin := buildBinary(t)
	for _, kind := range []string{"jetstream", "redis"} {
		t.Run(kind, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
			defer cancel()
			const keys, updates = 20, 600
			pg := pgtest.Start(t, pgtest.Config{})
			pg.Exec("postgres",
				"CREATE TABLE orders (id int PRIMARY KEY, v int)",
				"CREATE TABLE customers (id int PRIMARY KEY, v int)",
				fmt.Sprintf("INSERT INTO orders SELECT g, 0 FROM generate_series(1, %d) g", keys),
				"INSERT INTO customers SELECT g, 0 FROM generate_series(1, 5) g",
			)
			b := newRestartableBroker(ctx, t, kind, time.Second)
			var logs procLogs
			dump := logs.dump
			ingest := func(slot, tables string) (addr string, start func() *exec.Cmd) {
				addr = listenAddr(t)
				args := append([]string{"ingest", "--pg", pg.DSN("postgres"), "--listen", addr, "--log-level", "info",
					"--slot", slot, "--publication", slot, "--tables", tables, "--state-dir", t.TempDir()}, b.args...)
				return addr, logs.starter(t, bin, args)
			}
			addrA, startA := ingest("a", "orders")
			addrB, startB := ingest("b", "customers")
			a, bb := startA(), startB()
			defer func() {
				for _, c := range []*exec.Cmd{a, bb} {
					_ = c.Process.Kill()
					_ = c.Wait()
				}
			}()
			waitIngest(t, addrA, "ready", dump)
			waitIngest(t, addrB, "ready", dump)

			// B's table changes all along.
			stopB := make(chan struct{})
			bDone := make(chan int, 1)
			go func() { bDone <- touchCustomers(ctx, pg.DSN("postgres"), stopB) }()
			// A's: 600 single-row updates, each adding 1 to one order's v.
			written := make(chan error, 1)
			go func() { written <- updateTable(ctx, pg.DSN("postgres"), "orders", keys, updates) }()
			for deadline := time.Now().Add(30 * time.Second); countOn(b.stored(ctx, t), "db.orders.") < keys+updates/3 && time.Now().Before(deadline); {
				time.Sleep(5 * time.Millisecond)
			}
			_ = a.Process.Signal(syscall.SIGTERM)
			_ = a.Wait()
			time.Sleep(2 * time.Second) // twice the duplicate window, while B publishes
			a = startA()
			waitIngest(t, addrA, "ready", dump)
			if err := <-written; err != nil {
				t.Fatal(err)
			}
			close(stopB)
			touched := <-bDone
			if touched < 0 {
				t.Fatal("updating customers failed")
			}

			var evs []storedEvent
			for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
				evs = b.stored(ctx, t)
				if countOn(evs, "db.orders.") >= keys+updates && countOn(evs, "db.customers.") >= 5+touched {
					break
				}
			}
			checkInOrder(t, evs, "db.orders.", keys+updates, dump)
			checkInOrder(t, evs, "db.customers.", 5+touched, dump)
			t.Logf("%d order events and %d customer events, each key's once and in order; %s", keys+updates, 5+touched, lastLine(dump(), "high-water"))

			// A third ingest that would publish customers too.
			_, startC := ingest("c", "customers")
			c := startC()
			done := make(chan error, 1)
			go func() { done <- c.Wait() }()
			select {
			case err := <-done:
				if err == nil {
					t.Fatalf("an ingest publishing another's subjects exited with no error; logs:\n%s", dump())
				}
			case <-time.After(30 * time.Second):
				_ = c.Process.Kill()
				<-done
				t.Fatalf("an ingest publishing another's subjects was not refused at start; logs:\n%s", dump())
			}
			refusal := lastLine(dump(), "db.customers")
			for _, want := range []string{`slot "b"`, `slot "c"`} {
				if !strings.Contains(refusal, want) {
					t.Fatalf("the refusal does not name %s: %s", want, refusal)
				}
			}
		})
	}
}

// countOn counts the events on subjects starting with prefix.
func countOn(evs []storedEvent, prefix string) int {
	n := 0
	for _, e := range evs {
		if strings.HasPrefix(e.Subject, prefix) {
			n++
		}
	}
	return n
}

// checkInOrder checks that the events on subjects starting with prefix
// are n, and that each key's are v = 0, 1, 2, … once each.
func checkInOrder(t *testing.T, evs []storedEvent, prefix string, n int, logs func() string) {
	t.Helper()
	next := map[int]int{}
	got := 0
	for _, e := range evs {
		if !strings.HasPrefix(e.Subject, prefix) {
			continue
		}
		got++
		var ev struct {
			Key int `json:"key"`
			Doc struct {
				V int `json:"v"`
			} `json:"doc"`
		}
		if err := json.Unmarshal(e.Data, &ev); err != nil {
			t.Fatal(err)
		}
		if ev.Doc.V != next[ev.Key] {
			t.Fatalf("%s%d: v %d, want %d (a repeat, a gap or out of order); logs:\n%s", prefix, ev.Key, ev.Doc.V, next[ev.Key], logs())
		}
		next[ev.Key]++
	}
	if got != n {
		t.Fatalf("%d events on %s*, want %d; logs:\n%s", got, prefix, n, logs())
	}
}

// updateTable commits n single-row transactions, each adding 1 to one
// key's v, key by key.
func updateTable(ctx context.Context, dsn, table string, keys, n int) error {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	for i := range n {
		if _, err := conn.Exec(ctx, "UPDATE "+table+" SET v = v + 1 WHERE id = $1", i%keys+1); err != nil {
			return err
		}
		if i%50 == 0 {
			time.Sleep(10 * time.Millisecond)
		}
	}
	return nil
}

// touchCustomers updates the customers one at a time, every few
// milliseconds, until stop is closed, and returns how many updates
// committed (-1 after an error).
func touchCustomers(ctx context.Context, dsn string, stop <-chan struct{}) int {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return -1
	}
	defer conn.Close(context.Background())
	for n := 0; ; n++ {
		select {
		case <-stop:
			return n
		case <-time.After(3 * time.Millisecond):
		}
		if _, err := conn.Exec(ctx, "UPDATE customers SET v = v + 1 WHERE id = $1", n%5+1); err != nil {
			return -1
		}
	}
}
