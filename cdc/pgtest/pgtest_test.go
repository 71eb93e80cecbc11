package pgtest_test

import (
	"context"
	"testing"
	"time"

	"github.com/fanwire/fanwire/cdc/pgtest"
	"github.com/jackc/pgx/v5"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func query(t *testing.T, s *pgtest.Server, sql string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, s.DSN("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var v string
	if err := conn.QueryRow(ctx, sql).Scan(&v); err != nil {
		t.Fatal(err)
	}
	return v
}

// TestServer: a cluster ready for logical replication, whose committed data
// survives a clean restart and a crash (kill -9).
func TestServer(t *testing.T) {
	s := pgtest.Start(t, pgtest.Config{Settings: map[string]string{"logical_decoding_work_mem": "64kB"}})
	if v := query(t, s, "SHOW wal_level"); v != "logical" {
		t.Fatalf("wal_level = %q, want logical", v)
	}
	if v := query(t, s, "SHOW logical_decoding_work_mem"); v != "64kB" {
		t.Fatalf("logical_decoding_work_mem = %q, want the configured 64kB", v)
	}
	s.Exec("postgres", "CREATE TABLE t (id int PRIMARY KEY)", "INSERT INTO t VALUES (1)")
	s.Restart()
	s.Exec("postgres", "INSERT INTO t VALUES (2)")
	s.Kill()
	s.Start()
	if v := query(t, s, "SELECT string_agg(id::text, ',' ORDER BY id) FROM t"); v != "1,2" {
		t.Fatalf("after a restart and a crash the table holds %q, want 1,2", v)
	}
}
