package cdc_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/fanwire/fanwire/broker"
	"github.com/fanwire/fanwire/broker/brokertest"
	"github.com/fanwire/fanwire/cdc"
	"github.com/fanwire/fanwire/cdc/pgtest"
	"github.com/fanwire/fanwire/gateway"
	"github.com/fanwire/fanwire/gateway/gatewaytest"
	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap/zaptest"
)

func TestMain(m *testing.M) { brokertest.VerifyTestMain(m) }

// rig is a PostgreSQL cluster, a JetStream broker and a running ingest.
type rig struct {
	t    *testing.T
	pg   *pgtest.Server
	b    *broker.JetStream
	in   *cdc.Ingest
	stop func()
}

// jetStream starts an embedded NATS server and a JetStream broker on it
// with the stream CDC capturing db.>, and returns the broker and the URL.
func jetStream(tb testing.TB) (*broker.JetStream, string) {
	tb.Helper()
	ns := brokertest.NATS(tb)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	b, err := broker.DialJetStream(ctx, broker.JetStreamConfig{NATSConfig: broker.NATSConfig{URL: ns.ClientURL(), Subjects: []string{"db.>"}}, Stream: "CDC", Storage: "file"})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { b.Close() })
	return b, ns.ClientURL()
}

func newRig(t *testing.T, pg *pgtest.Server, mutate func(*cdc.Config)) *rig {
	t.Helper()
	b, _ := jetStream(t)
	r := &rig{t: t, pg: pg, b: b}
	r.start(mutate)
	return r
}

// start runs an ingest on the rig's database and broker and waits until
// it is ready.
func (r *rig) start(mutate func(*cdc.Config)) {
	r.t.Helper()
	r.startStandby(mutate)
	r.waitReady()
}

// startStandby runs an ingest that another ingest of the slot keeps
// waiting: it returns once the ingest is a standby.
func (r *rig) startStandby(mutate func(*cdc.Config)) {
	r.t.Helper()
	r.run(mutate)
	deadline := time.Now().Add(20 * time.Second)
	for !r.in.Standby() && !r.in.Ready() {
		if time.Now().After(deadline) {
			r.t.Fatal("ingest neither ready nor standby after 20s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// run starts an ingest on the rig's database and broker.
func (r *rig) run(mutate func(*cdc.Config)) {
	r.t.Helper()
	cfg := cdc.Config{DSN: r.pg.DSN("postgres"), Broker: r.b, Logger: zaptest.NewLogger(r.t), StatusInterval: 100 * time.Millisecond, Retry: 100 * time.Millisecond}
	if mutate != nil {
		mutate(&cfg)
	}
	in, err := cdc.New(cfg)
	if err != nil {
		r.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- in.Run(ctx) }()
	r.in = in
	var once bool
	r.stop = func() {
		if once {
			return
		}
		once = true
		cancel()
		if err := <-done; err != nil {
			r.t.Errorf("ingest: %v", err)
		}
	}
	r.t.Cleanup(r.stop)
}

// waitReady waits until the rig's ingest tails its slot.
func (r *rig) waitReady() {
	r.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !r.in.Ready() {
		if time.Now().After(deadline) {
			r.t.Fatal("ingest not ready after 20s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

type event struct {
	Subject    string
	Cursor     string
	ID         string          `json:"id"`
	Op         string          `json:"op"`
	Key        json.RawMessage `json:"key"`
	LSN        string          `json:"lsn"`
	CommitTime string          `json:"commit_time"`
	Doc        json.RawMessage `json:"doc"`
	Old        json.RawMessage `json:"old"`
	Unchanged  []string        `json:"unchanged"`
	// error events
	Source string `json:"source"`
	Reason string `json:"reason"`
	Error  string `json:"error"`
}

// events waits until the stream holds n events and returns them all.
func (r *rig) events(n int) []event {
	r.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		got := allEvents(r.t, r.b)
		if len(got) >= n || time.Now().After(deadline) {
			if len(got) != n {
				r.t.Fatalf("%d events in the stream, want %d: %+v", len(got), n, got)
			}
			return got
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func jsonEq(t *testing.T, what string, got json.RawMessage, want string) {
	t.Helper()
	var g, w any
	if err := json.Unmarshal(got, &g); err != nil {
		t.Fatalf("%s: %v: %s", what, err, got)
	}
	if err := json.Unmarshal([]byte(want), &w); err != nil {
		t.Fatalf("%s: bad expectation %s: %v", what, want, err)
	}
	gb, _ := json.Marshal(g)
	wb, _ := json.Marshal(w)
	if string(gb) != string(wb) {
		t.Fatalf("%s = %s, want %s", what, gb, wb)
	}
}

// TestBootstrapThenTail: rows present before the ingest starts are
// published once by the bootstrap; then inserts, updates, deletes and a
// truncate become events in commit order, with the documented payload.
func TestBootstrapThenTail(t *testing.T) {
	t.Parallel()
	pg := pgtest.Start(t, pgtest.Config{})
	pg.Exec("postgres",
		"CREATE TABLE orders (id int PRIMARY KEY, status text, total int)",
		"INSERT INTO orders VALUES (1, 'new', 10), (2, 'new', 20)",
	)
	r := newRig(t, pg, nil)
	evs := r.events(2)
	for i, e := range evs {
		if e.Op != "insert" || e.Subject != fmt.Sprintf("db.orders.%d", i+1) {
			t.Fatalf("bootstrap event %d: %s on %s", i, e.Op, e.Subject)
		}
	}
	jsonEq(t, "bootstrap doc", evs[0].Doc, `{"id":1,"status":"new","total":10}`)
	pg.Exec("postgres",
		"INSERT INTO orders VALUES (3, 'new', 30)",
		"UPDATE orders SET status = 'paid' WHERE id = 1",
		"DELETE FROM orders WHERE id = 2",
		"TRUNCATE orders",
	)
	evs = r.events(6)
	want := []struct{ op, subject string }{
		{"insert", "db.orders.3"}, {"update", "db.orders.1"}, {"delete", "db.orders.2"}, {"truncate", "db.orders.%truncate"},
	}
	for i, w := range want {
		e := evs[2+i]
		if e.Op != w.op || e.Subject != w.subject {
			t.Fatalf("event %d: %s on %s, want %s on %s", 2+i, e.Op, e.Subject, w.op, w.subject)
		}
		if e.LSN == "" || e.CommitTime == "" || e.ID == "" {
			t.Fatalf("event %d lacks lsn, commit_time or id: %+v", 2+i, e)
		}
	}
	// The WAL counters saw the messages, by kind and route.
	reg := prometheus.NewRegistry()
	reg.MustRegister(r.in.Collector())
	seen := map[string]bool{"insert/publish": false, "update/publish": false, "delete/publish": false, "truncate/publish": false, "begin/state": false, "commit/state": false, "relation/state": false}
	deadline := time.Now().Add(5 * time.Second)
	for {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() != "fanwire_wal_messages_total" {
				continue
			}
			for _, m := range mf.GetMetric() {
				var kind, route string
				for _, l := range m.GetLabel() {
					switch l.GetName() {
					case "kind":
						kind = l.GetValue()
					case "route":
						route = l.GetValue()
					}
				}
				if _, ok := seen[kind+"/"+route]; ok && m.GetCounter().GetValue() > 0 {
					seen[kind+"/"+route] = true
				}
			}
		}
		missing := []string{}
		for k, ok := range seen {
			if !ok {
				missing = append(missing, k)
			}
		}
		if len(missing) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("fanwire_wal_messages_total lacks %v", missing)
		}
		time.Sleep(50 * time.Millisecond)
	}
	jsonEq(t, "update doc", evs[3].Doc, `{"id":1,"status":"paid","total":10}`)
	jsonEq(t, "delete doc", evs[4].Doc, `null`)
	jsonEq(t, "delete old", evs[4].Old, `{"id":2}`)
}

// ops returns the events' "op subject" pairs, for compact comparisons.
func ops(evs []event) string {
	var b strings.Builder
	for _, e := range evs {
		fmt.Fprintf(&b, "%s %s\n", e.Op, e.Subject)
	}
	return b.String()
}

// TestRestartResumesFromTheSlot: changes made while the ingest is stopped
// are published after it starts again, once each, without a second
// bootstrap; the ingest also rides out a PostgreSQL restart.
func TestRestartResumesFromTheSlot(t *testing.T) {
	t.Parallel()
	pg := pgtest.Start(t, pgtest.Config{})
	pg.Exec("postgres", "CREATE TABLE t (id int PRIMARY KEY, v text)", "INSERT INTO t VALUES (1, 'a')")
	r := newRig(t, pg, nil)
	r.events(1)
	pg.Exec("postgres", "INSERT INTO t VALUES (2, 'b')")
	r.events(2)
	r.stop()
	pg.Exec("postgres", "INSERT INTO t VALUES (3, 'c')", "UPDATE t SET v = 'x' WHERE id = 1")
	r.start(nil)
	evs := r.events(4)
	if got := ops(evs[2:]); got != "insert db.t.3\nupdate db.t.1\n" {
		t.Fatalf("after the restart:\n%s", got)
	}
	// PostgreSQL restarts under the running ingest: it reconnects.
	pg.Restart()
	pg.Exec("postgres", "DELETE FROM t WHERE id = 3")
	evs = r.events(5)
	if evs[4].Op != "delete" || evs[4].Subject != "db.t.3" {
		t.Fatalf("after PostgreSQL restarted: %s %s", evs[4].Op, evs[4].Subject)
	}
}

// TestStreamedTransactions: with logical_decoding_work_mem at its minimum
// (64kB), big transactions stream. A committed one is published whole, in
// order; an aborted one not at all; inside a committed one, a rolled-back
// subtransaction's rows are dropped and the rest kept.
func TestStreamedTransactions(t *testing.T) {
	t.Parallel()
	pg := pgtest.Start(t, pgtest.Config{Settings: map[string]string{"logical_decoding_work_mem": "64kB"}})
	pg.Exec("postgres", "CREATE TABLE big (id int PRIMARY KEY, pad text)")
	r := newRig(t, pg, nil)
	pg.Exec("postgres",
		"BEGIN",
		"INSERT INTO big SELECT g, repeat('p', 200) FROM generate_series(1, 3000) g",
		"COMMIT",
		"BEGIN",
		"INSERT INTO big SELECT g, repeat('p', 200) FROM generate_series(10001, 13000) g",
		"ROLLBACK",
		"BEGIN",
		"INSERT INTO big SELECT g, repeat('p', 200) FROM generate_series(20001, 21000) g",
		"SAVEPOINT s",
		"INSERT INTO big SELECT g, repeat('p', 200) FROM generate_series(30001, 33000) g",
		"ROLLBACK TO SAVEPOINT s",
		"INSERT INTO big SELECT g, repeat('p', 200) FROM generate_series(40001, 41000) g",
		"COMMIT",
	)
	evs := r.events(5000)
	next := 1
	for i, e := range evs {
		if i == 3000 {
			next = 20001
		}
		if i == 4000 {
			next = 40001
		}
		if e.Subject != fmt.Sprintf("db.big.%d", next) {
			t.Fatalf("event %d is %s, want db.big.%d", i, e.Subject, next)
		}
		next++
	}
	var streamed int
	if err := pgQuery(pg, "SELECT coalesce(sum(stream_txns), 0) FROM pg_stat_replication_slots", &streamed); err != nil {
		t.Fatal(err)
	}
	if streamed == 0 {
		t.Fatal("no transaction was streamed: the test did not test streaming")
	}
}

// TestIdleDatabaseKeepsTheSlotAdvancing: with no change to any published
// table, heartbeats give the slot WAL to confirm; its confirmed position
// follows the server's WAL.
func TestIdleDatabaseKeepsTheSlotAdvancing(t *testing.T) {
	t.Parallel()
	pg := pgtest.Start(t, pgtest.Config{})
	pg.Exec("postgres", "CREATE TABLE t (id int PRIMARY KEY)", "CREATE TABLE other (id int)")
	newRig(t, pg, func(c *cdc.Config) { c.Tables = []string{"t"}; c.Heartbeat = 200 * time.Millisecond })
	var before string
	if err := pgQuery(pg, "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = 'fanwire'", &before); err != nil {
		t.Fatal(err)
	}
	// WAL that no published table is part of.
	pg.Exec("postgres", "INSERT INTO other SELECT generate_series(1, 1000)")
	deadline := time.Now().Add(10 * time.Second)
	for {
		var advanced bool
		if err := pgQuery(pg, "SELECT confirmed_flush_lsn > '"+before+"'::pg_lsn FROM pg_replication_slots WHERE slot_name = 'fanwire'", &advanced); err != nil {
			t.Fatal(err)
		}
		if advanced {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the slot's confirmed position stayed at %s", before)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestBadConfiguration: what a reconnect cannot fix ends Run with an error
// that says what to change.
func TestBadConfiguration(t *testing.T) {
	t.Parallel()
	pg := pgtest.Start(t, pgtest.Config{})
	pg.Exec("postgres", "CREATE TABLE nokey (v text)", "CREATE TABLE ok (id int PRIMARY KEY)")
	ns := brokertest.NATS(t)
	b, err := broker.DialNATS(context.Background(), broker.NATSConfig{URL: ns.ClientURL()})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	run := func(cfg cdc.Config) error {
		cfg.Broker = b
		in, err := cdc.New(cfg)
		if err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		return in.Run(ctx)
	}
	for _, tc := range []struct {
		cfg  cdc.Config
		want string
	}{
		{cdc.Config{DSN: pg.DSN("postgres"), Tables: []string{"nokey"}}, "public.nokey"},
		{cdc.Config{DSN: pg.DSN("postgres"), Tables: []string{"missing"}}, "public.missing"},
		{cdc.Config{DSN: pg.DSN("postgres"), Slot: "Bad-Slot"}, "slot"},
		{cdc.Config{}, "DSN is required"},
	} {
		err := run(tc.cfg)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("config %+v: error %v, want one naming %q", tc.cfg, err, tc.want)
		}
	}
	replica := pgtest.Start(t, pgtest.Config{Settings: map[string]string{"wal_level": "replica"}})
	if err := run(cdc.Config{DSN: replica.DSN("postgres")}); err == nil || !strings.Contains(err.Error(), "wal_level = logical") {
		t.Errorf("wal_level=replica: %v, want the setting to change", err)
	}
}

func pgQuery(pg *pgtest.Server, sql string, dst any) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, pg.DSN("postgres"))
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	return conn.QueryRow(ctx, sql).Scan(dst)
}

// TestUpdateReachesAWebSocketClient is the whole path: an UPDATE committed
// in PostgreSQL arrives, as an event with its cursor, at a WebSocket client
// of a gateway on the same JetStream stream.
func TestUpdateReachesAWebSocketClient(t *testing.T) {
	t.Parallel()
	pg := pgtest.Start(t, pgtest.Config{})
	pg.Exec("postgres", "CREATE TABLE orders (id int PRIMARY KEY, status text)", "INSERT INTO orders VALUES (42, 'new')")
	r := newRig(t, pg, nil)
	r.events(1)
	gw := gatewaytest.Start(t, gateway.Config{Broker: r.b, Subjects: []string{"db.>"}})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, _, err := websocket.Dial(ctx, gw.WSURL(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	read := func() map[string]any {
		t.Helper()
		_, b, err := c.Read(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatalf("%v: %s", err, b)
		}
		return m
	}
	if m := read(); m["type"] != "ready" {
		t.Fatalf("first message %v", m)
	}
	if err := c.Write(ctx, websocket.MessageText, []byte(`{"type":"subscribe","id":"o","subject":"db.orders.42"}`)); err != nil {
		t.Fatal(err)
	}
	if m := read(); m["type"] != "subscribed" {
		t.Fatalf("subscribe: %v", m)
	}
	pg.Exec("postgres", "UPDATE orders SET status = 'shipped' WHERE id = 42")
	m := read()
	data, _ := m["data"].(map[string]any)
	doc, _ := data["doc"].(map[string]any)
	if m["type"] != "event" || m["subject"] != "db.orders.42" || data["op"] != "update" || doc["status"] != "shipped" {
		t.Fatalf("got %v, want the update of order 42", m)
	}
	if cur, _ := m["cursor"].(string); !strings.HasPrefix(cur, "js:") {
		t.Fatalf("event without a JetStream cursor: %v", m)
	}
}

// TestUnchangedTOASTValues: an UPDATE that leaves a TOASTed column alone
// does not send it. With REPLICA IDENTITY FULL the event's doc has it
// (from the old row); without, the doc leaves it out and names it in
// "unchanged" — never null.
func TestUnchangedTOASTValues(t *testing.T) {
	t.Parallel()
	pg := pgtest.Start(t, pgtest.Config{})
	big := "(SELECT string_agg(md5(random()::text), '') FROM generate_series(1, 400))" // 12.8 kB, hardly compressible
	pg.Exec("postgres",
		"CREATE TABLE plain (id int PRIMARY KEY, big text, n int)",
		"CREATE TABLE full_ (id int PRIMARY KEY, big text, n int)",
		"ALTER TABLE full_ REPLICA IDENTITY FULL",
		"INSERT INTO plain VALUES (1, "+big+", 0)",
		"INSERT INTO full_ VALUES (1, "+big+", 0)",
	)
	r := newRig(t, pg, nil)
	r.events(2)
	pg.Exec("postgres", "UPDATE plain SET n = 1", "UPDATE full_ SET n = 1")
	evs := r.events(4)
	var plain, full map[string]any
	for _, e := range evs[2:] {
		var doc map[string]any
		if err := json.Unmarshal(e.Doc, &doc); err != nil {
			t.Fatal(err)
		}
		switch e.Subject {
		case "db.plain.1":
			plain = doc
			if len(e.Unchanged) != 1 || e.Unchanged[0] != "big" {
				t.Fatalf("plain: unchanged = %v, want [big]", e.Unchanged)
			}
		case "db.full_.1":
			full = doc
			if len(e.Unchanged) != 0 {
				t.Fatalf("full: unchanged = %v, want none", e.Unchanged)
			}
		}
	}
	if _, ok := plain["big"]; ok {
		t.Fatalf("plain: the unchanged TOAST column is in the doc: %v", plain["big"])
	}
	if s, _ := full["big"].(string); len(s) != 12800 {
		t.Fatalf("full: big has %d characters, want the 12,800 of the old row", len(s))
	}
}

// TestBootstrapWhileWritesRun starts the ingest while rows are being
// inserted: every row is published exactly once, either by the bootstrap
// or by the tail, never by both and never by neither.
func TestBootstrapWhileWritesRun(t *testing.T) {
	t.Parallel()
	pg := pgtest.Start(t, pgtest.Config{})
	pg.Exec("postgres", "CREATE TABLE w (id int PRIMARY KEY)")
	const n = 3000
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, pg.DSN("postgres"))
		if err != nil {
			done <- err
			return
		}
		defer conn.Close(context.Background())
		for i := 1; i <= n; i++ {
			if _, err := conn.Exec(ctx, "INSERT INTO w VALUES ($1)", i); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	time.Sleep(100 * time.Millisecond) // some rows before the snapshot, most after
	r := newRig(t, pg, nil)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	evs := r.events(n)
	seen := make(map[string]int)
	for _, e := range evs {
		seen[e.Subject]++
	}
	for i := 1; i <= n; i++ {
		if c := seen[fmt.Sprintf("db.w.%d", i)]; c != 1 {
			t.Fatalf("row %d published %d times", i, c)
		}
	}
}

// TestColumnTypesThroughReplication: values keep their JSON types on the
// way through pgoutput, as docs/ingest.md says (the encoder's own tests
// cover each type in depth).
func TestColumnTypesThroughReplication(t *testing.T) {
	t.Parallel()
	pg := pgtest.Start(t, pgtest.Config{})
	pg.Exec("postgres", `CREATE TABLE ty (id bigint PRIMARY KEY, n numeric, f float8, b bool, j jsonb, ts timestamptz,
		d date, by bytea, a int[], tx text, u uuid, z text)`)
	r := newRig(t, pg, nil)
	pg.Exec("postgres", `INSERT INTO ty VALUES (9007199254740993, 12345678901234567890.123, 'NaN', true, '{"k":[1,"x"]}',
		'2026-11-30 12:34:56.5+02', '2026-11-30', '\x00ff10', '{{1,2},{3,NULL}}', 'a"b', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', NULL)`)
	evs := r.events(1)
	jsonEq(t, "doc", evs[0].Doc, `{"id":9007199254740993,"n":"12345678901234567890.123","f":"NaN","b":true,"j":{"k":[1,"x"]},
		"ts":"2026-11-30T10:34:56.5+00:00","d":"2026-11-30","by":"AP8Q","a":[[1,2],[3,null]],"tx":"a\"b",
		"u":"a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11","z":null}`)
	if !bytes.Contains(evs[0].Doc, []byte(`9007199254740993`)) {
		t.Fatalf("the int8 key lost digits: %s", evs[0].Doc)
	}
}

// TestBigTransactionKeepsItsRows: a transaction of many rows is held until
// its commit while the replication connection keeps reading; every row's
// event must carry that row's own values (the connection's read buffers are
// reused, so held rows need bytes of their own).
func TestBigTransactionKeepsItsRows(t *testing.T) {
	t.Parallel()
	pg := pgtest.Start(t, pgtest.Config{})
	pg.Exec("postgres", "CREATE TABLE bt (id int PRIMARY KEY, v text)")
	r := newRig(t, pg, nil)
	const n = 20000
	pg.Exec("postgres", "INSERT INTO bt SELECT g, 'value-' || g || repeat('x', g % 97) FROM generate_series(1, 20000) g")
	evs := r.events(n)
	for i, e := range evs {
		var doc struct {
			ID int    `json:"id"`
			V  string `json:"v"`
		}
		if err := json.Unmarshal(e.Doc, &doc); err != nil {
			t.Fatal(err)
		}
		want := fmt.Sprintf("value-%d%s", doc.ID, strings.Repeat("x", doc.ID%97))
		if doc.ID != i+1 || doc.V != want || e.Subject != fmt.Sprintf("db.bt.%d", doc.ID) {
			t.Fatalf("event %d: subject %s, id %d, v %.40q…; want row %d's own values", i, e.Subject, doc.ID, doc.V, i+1)
		}
	}
}

// TestCompositeKeySubjectsCannotCollide: each value of a composite key is
// escaped on its own before the values are joined with ',', so a separator
// inside a value cannot make two keys share a subject. They were joined
// first: ("a,b", "c") and ("a", "b,c") were both "a%2Cb%2Cc".
func TestCompositeKeySubjectsCannotCollide(t *testing.T) {
	t.Parallel()
	pg := pgtest.Start(t, pgtest.Config{})
	pg.Exec("postgres",
		"CREATE TABLE pairs (a text, b text, PRIMARY KEY (a, b))",
		`INSERT INTO pairs VALUES ('a,b', 'c'), ('a', 'b,c'), ('', 'x'), ('%', 'x'), ('.', '*'), ('%2C', 'y')`,
	)
	r := newRig(t, pg, nil)
	pg.Exec("postgres", `INSERT INTO pairs VALUES ('a,b,c', ''), ('a.b', '>')`)
	want := map[string]string{
		"db.pairs.a%2Cb,c":     `["a,b","c"]`,
		"db.pairs.a,b%2Cc":     `["a","b,c"]`,
		"db.pairs.%,x":         `["","x"]`,
		"db.pairs.%25,x":       `["%","x"]`,
		"db.pairs.%2E,%2A":     `[".","*"]`,
		"db.pairs.%252C,y":     `["%2C","y"]`,
		"db.pairs.a%2Cb%2Cc,%": `["a,b,c",""]`,
		"db.pairs.a%2Eb,%3E":   `["a.b",">"]`,
	}
	evs := r.events(len(want))
	for _, e := range evs {
		k, ok := want[e.Subject]
		if !ok {
			t.Errorf("unexpected subject %q (key %s)", e.Subject, e.Key)
			continue
		}
		jsonEq(t, e.Subject, e.Key, k)
		delete(want, e.Subject)
	}
	if len(want) > 0 {
		t.Errorf("subjects missing: %v", want)
	}
}

// TestStopEndsAWaitingReceive: an ingest waiting for WAL ends as soon as
// its context is cancelled, not when its receive's deadline (the next
// standby status update, an hour away here) passes.
func TestStopEndsAWaitingReceive(t *testing.T) {
	t.Parallel()
	pg := pgtest.Start(t, pgtest.Config{})
	pg.Exec("postgres", "CREATE TABLE t (id int PRIMARY KEY)")
	r := newRig(t, pg, func(c *cdc.Config) { c.StatusInterval = time.Hour; c.Heartbeat = -1 })
	pg.Exec("postgres", "INSERT INTO t VALUES (1)")
	r.events(1)
	time.Sleep(100 * time.Millisecond) // the reader waits in a receive
	start := time.Now()
	r.stop()
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("the ingest took %v to stop", took)
	}
}
