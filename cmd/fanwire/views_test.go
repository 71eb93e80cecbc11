package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math/big"
	"math/rand/v2"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/fanwire/fanwire/broker/brokertest"
	"github.com/fanwire/fanwire/cdc/pgtest"
	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// The live views of issue 25, end to end: rows of a real PostgreSQL
// cluster, published by a `fanwire ingest` process into JetStream, served
// by a `fanwire ws` process to a native WebSocket client that builds its
// views from the frames (events upsert data.doc by subject, deletes and
// leaves remove it, a truncate clears its table, a synced with keys drops
// the keys it does not list). At every point where a view is complete
// (its synced, or a marker row's event after it) the view must equal the
// SQL query it stands for, document by document, as the ingest encodes a
// row.

// The filters. doc.total is a numeric column, which the ingest sends as a
// string ("150.50", exact): compared as a number it needs double().
const (
	openOver100  = "doc.status == 'open' && double(doc.total) > 100"
	germanNoNote = "doc.meta.ship.country == 'DE' && doc.note == null"
	qtyAtLeast3  = "doc.qty >= 3"
)

// TestLiveViewsThroughTheIngest: a client opens filtered views with
// from:"latest" on a table of common column types and an unfiltered and a
// filtered one on a table with a composite key; each equals its SQL
// answer at its synced. Rows then move into and out of the filters, are
// deleted and inserted: each change brings exactly the event or leave
// the protocol promises. The gateway process is killed (SIGKILL) while
// rows keep changing, and more change while it is down; the client
// reconnects to a new process and resubscribes from its last cursors with
// the same filters: after the synced (which lists the view's keys) and
// after more changes, the views equal the SQL answers again. Finally the
// composite-key table is truncated.
func TestLiveViewsThroughTheIngest(t *testing.T) {
	t.Parallel() // a process-level test that mostly waits: beside the others (make test's time)
	bin := buildBinary(t)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	pg := pgtest.Start(t, pgtest.Config{})
	dsn := pg.DSN("postgres")
	pg.Exec("postgres",
		`CREATE TABLE orders (id int8 PRIMARY KEY, status text NOT NULL, total numeric(12,2) NOT NULL, paid bool NOT NULL,
			placed_at timestamptz NOT NULL, meta jsonb, note text, customer text NOT NULL)`,
		`CREATE TABLE lines (region text, code int8, sku text NOT NULL, qty int NOT NULL, PRIMARY KEY (region, code))`,
		`CREATE TABLE marks (id int PRIMARY KEY, n int NOT NULL)`,
		`INSERT INTO marks VALUES (1, 0)`,
	)
	db, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close(context.Background())
	ids := []int64{-5, 9007199254740993} // a negative key, and one past 2^53
	for i := int64(1); i <= 40; i++ {
		ids = append(ids, i)
	}
	for i := int64(101); i <= 160; i++ { // the churn's rows
		ids = append(ids, i)
	}
	for _, id := range ids {
		insertOrder(ctx, t, db, id)
	}
	for _, l := range []struct {
		region string
		code   int64
		sku    string
		qty    int
	}{
		{"eu.west", 1, "a.b", 2}, {"a,b", 2, "x", 3}, {"", 3, "", 4}, {"ü x", 4, "ü", 5},
		{"a", -7, `"q"`, 1}, {"a,b,c", 2, ",", 3}, {"100%", 5, "%", 6}, {"gone", 6, "-", 9},
	} {
		if _, err := db.Exec(ctx, "INSERT INTO lines VALUES ($1, $2, $3, $4)", l.region, l.code, l.sku, l.qty); err != nil {
			t.Fatal(err)
		}
	}

	ns := brokertest.NATS(t)
	brokerArgs := []string{"--broker", "jetstream", "--nats-url", ns.ClientURL(), "--subjects", "db.>", "--stream", "CDC", "--log-level", "warn"}
	var logs procLogs
	ingestAddr := listenAddr(t)
	ingest := logs.starter(t, bin, append([]string{"ingest", "--pg", dsn, "--listen", ingestAddr}, brokerArgs...))()
	t.Cleanup(func() {
		_ = ingest.Process.Kill()
		_ = ingest.Wait()
	})
	waitIngest(t, ingestAddr, "ready", logs.dump)
	// Changes after the bootstrap: the snapshots meet updates and a
	// delete as the newest event of a subject.
	execSQL(ctx, t, db, "UPDATE lines SET qty = 8 WHERE region = 'a,b' AND code = 2",
		"DELETE FROM lines WHERE region = 'gone'",
		"UPDATE orders SET note = NULL, status = 'open' WHERE id = 2")

	wsAddr := listenAddr(t)
	startWS := logs.starter(t, bin, append([]string{"ws", "--listen", wsAddr, "--allow-anonymous"}, brokerArgs...))
	ws := startWS()
	t.Cleanup(func() {
		_ = ws.Process.Kill()
		_ = ws.Wait()
	})
	if !readyWithin(wsAddr, 30*time.Second) {
		t.Fatalf("fanwire ws not ready; logs:\n%s", logs.dump())
	}

	v1 := &liveView{id: "v1", subject: "db.orders.*", where: openOver100, pass: passOpenOver100, docs: map[string]map[string]any{}}
	v2 := &liveView{id: "v2", subject: "db.orders.*", where: germanNoNote, pass: passGermanNoNote, docs: map[string]map[string]any{}}
	v3 := &liveView{id: "v3", subject: "db.lines.*", docs: map[string]map[string]any{}}
	v4 := &liveView{id: "v4", subject: "db.lines.*", where: qtyAtLeast3, pass: passQtyAtLeast3, docs: map[string]map[string]any{}}
	marks := &liveView{id: "m", subject: "db.marks.*", docs: map[string]map[string]any{}}
	c := dialViews(ctx, t, wsAddr, logs.dump, marks, v1, v2, v3, v4)
	mark := 0
	// sync writes a marker row and reads until the client has its event:
	// every change committed before it has reached every live view.
	syncMark := func(what string) {
		t.Helper()
		mark++
		execSQL(ctx, t, db, fmt.Sprintf("UPDATE marks SET n = %d", mark))
		c.until(ctx, what, func() bool { return marks.mark() >= mark })
	}
	c.subscribe(marks, "")
	c.until(ctx, "the marker's subscription", func() bool { return marks.active }) // live: events published after this
	syncMark("the marker after the bootstrap")

	// 1. The views open on the rows the ingest published.
	c.subscribe(v1, "latest")
	c.subscribe(v2, "latest")
	c.until(ctx, "v1 and v2 synced", func() bool { return v1.synced && v2.synced })
	for _, v := range []*liveView{v1, v2} {
		if v.hadKeys {
			t.Errorf("%s: from:\"latest\" synced listed keys %v; only a filtered resume's does", v.id, v.keys)
		}
	}
	c.check(t, "at the first synced", v1, ordersSQL(ctx, t, db, "status = 'open' AND total > 100"))
	c.check(t, "at the first synced", v2, ordersSQL(ctx, t, db, "meta->'ship'->>'country' = 'DE' AND note IS NULL"))
	if len(v1.docs) < 10 || len(v2.docs) < 3 {
		t.Fatalf("the views hold %d and %d documents: too few for this test to mean much", len(v1.docs), len(v2.docs))
	}

	// 2. Rows move into and out of the views, one change a transaction;
	// each brings the frames the protocol promises, and no others.
	all := func() map[string]map[string]any { return ordersSQL(ctx, t, db, "true") }
	used := map[string]bool{}
	pick := func(what string, ok func(s string, doc map[string]any) bool) string {
		t.Helper()
		now := all()
		var subjects []string
		for s := range now {
			subjects = append(subjects, s)
		}
		sort.Strings(subjects)
		for _, s := range subjects {
			id, _ := strconv.ParseInt(strings.TrimPrefix(s, "db.orders."), 10, 64)
			if id >= 1 && id <= 41 && !used[s] && ok(s, now[s]) {
				used[s] = true
				return s
			}
		}
		t.Fatalf("no order row is %s", what)
		return ""
	}
	in := func(v *liveView) func(string, map[string]any) bool {
		return func(_ string, d map[string]any) bool { return v.pass(d) }
	}
	out := func(v *liveView) func(string, map[string]any) bool {
		return func(_ string, d map[string]any) bool { return !v.pass(d) }
	}
	both := func(f, g func(string, map[string]any) bool) func(string, map[string]any) bool {
		return func(s string, d map[string]any) bool { return f(s, d) && g(s, d) }
	}
	var want1, want2 []string
	change := func(subject string, sql string, args ...any) {
		t.Helper()
		before := all()[subject]
		if _, err := db.Exec(ctx, sql, args...); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
		after := all()[subject]
		want1 = append(want1, expectedFrames(v1, subject, before, after)...)
		want2 = append(want2, expectedFrames(v2, subject, before, after)...)
	}
	edge := pick("open at exactly 100.00", func(_ string, d map[string]any) bool { return d["status"] == "open" && d["total"] == "100.00" })
	change(edge, "UPDATE orders SET total = total + 0.01 WHERE id = $1", idOf(edge)) // 100.01: into v1
	s := pick("in v1 and out of v2", both(in(v1), out(v2)))
	change(s, "UPDATE orders SET status = 'closed' WHERE id = $1", idOf(s)) // out of v1: a leave
	s = pick("in v1", in(v1))
	change(s, "DELETE FROM orders WHERE id = $1", idOf(s)) // a delete: a leave (also from v2 if it held it)
	s = pick("in v1, again", in(v1))
	change(s, "UPDATE orders SET paid = NOT paid WHERE id = $1", idOf(s)) // stays in v1: an event
	s = pick("German with a note", func(_ string, d map[string]any) bool {
		return d["note"] != nil && passGermanNoNote(map[string]any{"meta": d["meta"], "note": nil})
	})
	change(s, "UPDATE orders SET note = NULL WHERE id = $1", idOf(s)) // into v2
	s = pick("in v2", in(v2))
	change(s, `UPDATE orders SET meta = jsonb_set(meta, '{ship,country}', '"FR"') WHERE id = $1`, idOf(s)) // out of v2
	s = pick("in neither view", both(out(v1), out(v2)))
	change(s, "UPDATE orders SET customer = customer || '!' WHERE id = $1", idOf(s)) // no frame
	change("db.orders.41", `INSERT INTO orders VALUES (41, 'open', 250.00, false, '2024-02-29 23:59:59.999999+14',
		'{"ship": {"country": "DE", "w": [1.50, {"deep": null}]}}', NULL, 'new ''row'' «ü» 🚀')`) // into both
	used["db.orders.41"] = true
	syncMark("the marker after the changes")
	for _, x := range []struct {
		v    *liveView
		want []string
	}{{v1, want1}, {v2, want2}} {
		if !slices.Equal(x.v.log, x.want) {
			t.Errorf("%s: frames after the changes\n got %q\nwant %q", x.v.id, x.v.log, x.want)
		}
	}
	c.check(t, "after the changes", v1, ordersSQL(ctx, t, db, "status = 'open' AND total > 100"))
	c.check(t, "after the changes", v2, ordersSQL(ctx, t, db, "meta->'ship'->>'country' = 'DE' AND note IS NULL"))

	// 3. The gateway dies while rows keep changing, and more change while
	// it is down; the client comes back to a new process and resumes.
	var churned atomic.Int64
	stop := make(chan struct{})
	churnDone := make(chan error, 1)
	go func() { churnDone <- churn(ctx, dsn, stop, &churned) }()
	stopChurn := func() {
		t.Helper()
		if stop == nil {
			return
		}
		close(stop)
		stop = nil
		if err := <-churnDone; err != nil {
			t.Fatalf("churn: %v", err)
		}
	}
	defer func() {
		if stop != nil {
			close(stop)
			<-churnDone
		}
	}()
	waitChurn := func(what string, n int64) {
		t.Helper()
		target := churned.Load() + n
		for deadline := time.Now().Add(20 * time.Second); churned.Load() < target; time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("the churn did not make %d more changes %s", n, what)
			}
		}
	}
	seen := c.frames
	c.until(ctx, "the churn's frames", func() bool { return c.frames >= seen+20 })
	_ = ws.Process.Kill()
	_ = ws.Wait()
	c.drain(ctx)
	t.Logf("gateway killed after %d churn changes; the client had v1 at %s, v2 at %s", churned.Load(), v1.cursor, v2.cursor)
	leave1 := pick("in v1, to leave while the gateway is down", both(in(v1), out(v2)))
	gone1 := pick("in v1, to be deleted while the gateway is down", in(v1))
	enter1 := pick("open, not over 100, to enter v1 while the gateway is down", func(_ string, d map[string]any) bool {
		return d["status"] == "open" && !passOpenOver100(d)
	})
	leave2 := pick("in v2, to leave while the gateway is down", both(in(v2), out(v1)))
	execSQL(ctx, t, db,
		fmt.Sprintf("UPDATE orders SET status = 'pending' WHERE id = %d", idOf(leave1)),
		fmt.Sprintf("DELETE FROM orders WHERE id = %d", idOf(gone1)),
		fmt.Sprintf("UPDATE orders SET total = 200.5 WHERE id = %d", idOf(enter1)),
		fmt.Sprintf("UPDATE orders SET note = 'set while away' WHERE id = %d", idOf(leave2)))
	waitChurn("while the gateway is down", 20)
	mark++
	execSQL(ctx, t, db, fmt.Sprintf("UPDATE marks SET n = %d", mark))
	waitStored(ctx, t, ns.ClientURL(), "db.marks.1", mark) // the changes above are in the stream
	ws = startWS()
	if !readyWithin(wsAddr, 30*time.Second) {
		t.Fatalf("fanwire ws not ready after the restart; logs:\n%s", logs.dump())
	}
	c = dialViews(ctx, t, wsAddr, logs.dump, marks, v1, v2, v3, v4)
	c.subscribe(marks, "")
	c.until(ctx, "the marker's subscription", func() bool { return marks.active })
	c.subscribe(v1, v1.cursor)
	c.subscribe(v2, v2.cursor)
	c.until(ctx, "v1 and v2 synced after the restart", func() bool { return v1.synced && v2.synced })
	for _, v := range []*liveView{v1, v2} {
		if !v.hadKeys {
			t.Errorf("%s: the synced of a filtered resume has no keys", v.id)
		}
		t.Logf("%s resumed: synced at %s with %d keys; it dropped %d documents the client held: %v", v.id, v.cursor, len(v.keys), len(v.dropped), v.dropped)
	}
	for _, x := range []struct {
		v      *liveView
		s      string
		inView bool
	}{{v1, leave1, false}, {v1, gone1, false}, {v1, enter1, true}, {v2, leave2, false}} {
		if _, ok := x.v.docs[x.s]; ok != x.inView {
			t.Errorf("%s at its synced after the restart: %s in the view is %v, want %v (changed while the gateway was down)", x.v.id, x.s, ok, x.inView)
		}
		// A leave cannot be replayed: what left while the client was
		// away goes by the synced's keys.
		if !x.inView && !slices.Contains(x.v.dropped, x.s) {
			t.Errorf("%s: %s left the view while the gateway was down, but the synced's keys did not drop it (dropped %v)", x.v.id, x.s, x.v.dropped)
		}
	}
	waitChurn("after the resume", 20)
	stopChurn()
	syncMark("the marker after the churn")
	c.check(t, "after the restart", v1, ordersSQL(ctx, t, db, "status = 'open' AND total > 100"))
	c.check(t, "after the restart", v2, ordersSQL(ctx, t, db, "meta->'ship'->>'country' = 'DE' AND note IS NULL"))
	t.Logf("%d churn changes in all", churned.Load())

	// 4. The composite-key table: an unfiltered view and a filtered one,
	// then a truncate.
	c.subscribe(v3, "latest")
	c.subscribe(v4, "latest")
	c.until(ctx, "v3 and v4 synced", func() bool { return v3.synced && v4.synced })
	c.check(t, "at the first synced", v3, linesSQL(ctx, t, db, "true"))
	c.check(t, "at the first synced", v4, linesSQL(ctx, t, db, "qty >= 3"))
	execSQL(ctx, t, db, "INSERT INTO lines VALUES ('late.', 1, 'l', 5)", "TRUNCATE lines", "INSERT INTO lines VALUES ('after,truncate', 0, 'ü', 7)")
	syncMark("the marker after the truncate")
	for _, v := range []*liveView{v3, v4} {
		want := []string{"event " + lineSubject("late.", 1), "truncate db.lines.%truncate", "event " + lineSubject("after,truncate", 0)}
		if !slices.Equal(v.log, want) {
			t.Errorf("%s: frames after the truncate\n got %q\nwant %q", v.id, v.log, want)
		}
	}
	c.check(t, "after the truncate", v3, linesSQL(ctx, t, db, "true"))
	c.check(t, "after the truncate", v4, linesSQL(ctx, t, db, "qty >= 3"))
	c.close()
}

// liveView is one subscription's view as the client builds it.
type liveView struct {
	id, subject, where string
	pass               func(doc map[string]any) bool // the filter in Go, as SQL has it (nil: none)

	docs    map[string]map[string]any // subject → data.doc
	cursor  string                    // the last cursor the subscription got
	from    string                    // its subscription's from
	active  bool                      // its subscription got its subscribed
	synced  bool                      // and its synced
	hadKeys bool                      // the synced had keys
	keys    []string                  // and these
	dropped []string                  // the documents the synced's keys dropped
	log     []string                  // the frames since the synced: "event S", "leave S", "delete S", "truncate S"
}

// mark is the marker view's marker (db.marks.1's n).
func (v *liveView) mark() int {
	n, _ := v.docs["db.marks.1"]["n"].(json.Number)
	m, _ := strconv.Atoi(string(n))
	return m
}

// viewConn is the client's connection: it reads frames only while the
// test waits for something (until, drain).
type viewConn struct {
	t      *testing.T
	ws     *websocket.Conn
	views  map[string]*liveView
	logs   func() string
	frames int                 // events and leaves received
	recent []string            // the last frames, for failure messages
	odd    []string            // frames that break the protocol's promises
	events map[string][]string // event cursor → its frames' subs, one per delivery
}

func dialViews(ctx context.Context, t *testing.T, addr string, logs func() string, views ...*liveView) *viewConn {
	t.Helper()
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	ws, _, err := websocket.Dial(dctx, "ws://"+addr+"/ws", nil)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	ws.SetReadLimit(64 << 20)
	c := &viewConn{t: t, ws: ws, views: map[string]*liveView{}, logs: logs, events: map[string][]string{}}
	for _, v := range views {
		c.views[v.id] = v
	}
	return c
}

func (c *viewConn) close() {
	c.ws.CloseNow()
	if len(c.odd) > 0 {
		c.t.Errorf("frames that break the protocol:\n%s", strings.Join(c.odd, "\n"))
	}
	// protocol.md: one delivery per event per connection, subs listing
	// every subscription that matched (feeds apart).
	var again []string
	for cur, subs := range c.events {
		if len(subs) > 1 {
			again = append(again, cur+" subs "+strings.Join(subs, " then "))
		}
	}
	if len(again) > 0 {
		sort.Strings(again)
		c.t.Logf("%d of %d events were delivered more than once on one connection, once per view: %s", len(again), len(c.events), strings.Join(again[:min(3, len(again))], "; "))
	}
}

// subscribe sends v's subscribe, from "" (live), "latest" or a cursor.
func (c *viewConn) subscribe(v *liveView, from string) {
	c.t.Helper()
	f := map[string]string{"type": "subscribe", "id": v.id, "subject": v.subject}
	if v.where != "" {
		f["where"] = v.where
	}
	if from != "" {
		f["from"] = from
	}
	b, _ := json.Marshal(f)
	if err := c.ws.Write(context.Background(), websocket.MessageText, b); err != nil {
		c.t.Fatalf("subscribe %s: %v", b, err)
	}
	v.from, v.active, v.synced, v.hadKeys, v.keys, v.dropped, v.log = from, false, false, false, nil, nil, nil
}

// until reads frames until cond holds, for at most 20 s.
func (c *viewConn) until(ctx context.Context, what string, cond func() bool) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	for !cond() {
		if err := c.read(ctx); err != nil {
			c.t.Fatalf("waiting for %s: %v\nlast frames:\n%s\nlogs:\n%s", what, err, strings.Join(c.recent, "\n"), c.logs())
		}
	}
}

// drain reads what the connection still holds until it fails (its
// server is gone).
func (c *viewConn) drain(ctx context.Context) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	for c.read(ctx) == nil {
	}
	if ctx.Err() != nil {
		c.t.Fatal("the connection outlived its gateway process")
	}
	c.close()
}

// read reads one WebSocket message and applies its frames.
func (c *viewConn) read(ctx context.Context) error {
	_, b, err := c.ws.Read(ctx)
	if err != nil {
		return err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if len(c.recent) == 30 {
			c.recent = c.recent[1:]
		}
		c.recent = append(c.recent, line)
		c.apply(line)
	}
	return nil
}

// apply applies one frame to the views.
func (c *viewConn) apply(line string) {
	var f struct {
		Type    string          `json:"type"`
		ID      string          `json:"id"`
		Subject string          `json:"subject"`
		Cursor  string          `json:"cursor"`
		Subs    []string        `json:"subs"`
		Data    json.RawMessage `json:"data"`
		Keys    *[]string       `json:"keys"`
		Code    string          `json:"code"`
	}
	if err := json.Unmarshal([]byte(line), &f); err != nil {
		c.t.Fatalf("frame %q: %v", line, err)
	}
	oddf := func(format string, args ...any) { c.odd = append(c.odd, fmt.Sprintf(format, args...)+": "+line) }
	switch f.Type {
	case "subscribed":
		if v := c.views[f.ID]; v != nil {
			v.active = true
		}
	case "ready", "unsubscribed", "pong":
	case "error":
		c.t.Fatalf("error frame %s\nlogs:\n%s", line, c.logs())
	case "synced":
		v := c.views[f.ID]
		if v == nil {
			oddf("synced for no subscription")
			return
		}
		if v.synced {
			oddf("a second synced")
		}
		v.synced, v.log = true, nil
		c.advance(v, f.Cursor, oddf)
		if f.Keys != nil {
			v.hadKeys, v.keys = true, *f.Keys
			listed := map[string]bool{}
			for _, k := range v.keys {
				listed[k] = true
			}
			for s := range v.docs {
				if !listed[s] {
					delete(v.docs, s)
					v.dropped = append(v.dropped, s)
				}
			}
			sort.Strings(v.dropped)
		}
	case "event", "leave":
		c.frames++
		if f.Type == "event" {
			c.events[f.Cursor] = append(c.events[f.Cursor], strings.Join(f.Subs, ","))
		}
		var data map[string]any
		if f.Type == "event" {
			dec := json.NewDecoder(strings.NewReader(string(f.Data)))
			dec.UseNumber()
			if err := dec.Decode(&data); err != nil {
				oddf("data is not an object")
				return
			}
		}
		for _, id := range f.Subs {
			v := c.views[id]
			if v == nil {
				oddf("a frame for no subscription %q", id)
				continue
			}
			c.advance(v, f.Cursor, oddf)
			if !v.synced && v.from != "" && v.from != "latest" && !cursorBefore(v.from, f.Cursor) {
				oddf("%s resumed after %s: a document at or before its cursor was sent again", id, v.from)
			}
			if f.Type == "leave" {
				if v.pass == nil {
					oddf("a leave on %s, an unfiltered subscription", id)
				}
				if _, ok := v.docs[f.Subject]; !ok {
					oddf("a leave of a document %s does not hold", id)
				}
				delete(v.docs, f.Subject)
				v.log = append(v.log, "leave "+f.Subject)
				continue
			}
			op, _ := data["op"].(string)
			switch op {
			case "delete":
				if v.pass != nil {
					oddf("a delete event on %s, a filtered subscription (it gets leaves)", id)
				}
				delete(v.docs, f.Subject)
				v.log = append(v.log, "delete "+f.Subject)
			case "truncate":
				prefix := strings.TrimSuffix(f.Subject, "%truncate")
				for s := range v.docs {
					if strings.HasPrefix(s, prefix) && !strings.Contains(s[len(prefix):], ".") {
						delete(v.docs, s)
					}
				}
				v.log = append(v.log, "truncate "+f.Subject)
			default:
				doc, ok := data["doc"].(map[string]any)
				if !ok {
					oddf("an %s event without a doc", op)
					continue
				}
				if v.pass != nil && !v.pass(doc) {
					oddf("%s got a document its filter refuses", id)
				}
				v.docs[f.Subject] = doc
				v.log = append(v.log, "event "+f.Subject)
			}
		}
	default:
		oddf("an unknown frame type")
	}
}

// advance moves v's cursor to cur; cursors never go back.
func (c *viewConn) advance(v *liveView, cur string, oddf func(string, ...any)) {
	if cur == "" {
		return
	}
	if v.cursor != "" && cursorBefore(cur, v.cursor) {
		oddf("%s: cursor %s after %s", v.id, cur, v.cursor)
	}
	v.cursor = cur
}

// cursorBefore reports a < b for JetStream cursors (js:<sequence>).
func cursorBefore(a, b string) bool {
	x, _ := strconv.ParseUint(strings.TrimPrefix(a, "js:"), 10, 64)
	y, _ := strconv.ParseUint(strings.TrimPrefix(b, "js:"), 10, 64)
	return x < y
}

// check fails the test unless v's documents are want's, field by field.
func (c *viewConn) check(t *testing.T, when string, v *liveView, want map[string]map[string]any) {
	t.Helper()
	var diffs []string
	for s, w := range want {
		g, ok := v.docs[s]
		switch {
		case !ok:
			diffs = append(diffs, "missing "+s)
		case !reflect.DeepEqual(g, w):
			for _, k := range unionKeys(g, w) {
				if !reflect.DeepEqual(g[k], w[k]) {
					diffs = append(diffs, fmt.Sprintf("%s.%s: got %#v, SQL %#v", s, k, g[k], w[k]))
				}
			}
		}
	}
	for s := range v.docs {
		if _, ok := want[s]; !ok {
			diffs = append(diffs, "extra "+s)
		}
	}
	sort.Strings(diffs)
	if len(diffs) > 0 {
		t.Fatalf("%s: view %s (%s) differs from its SQL answer (%d rows), at cursor %s:\n%s", when, v.id, v.where, len(want), v.cursor, strings.Join(diffs, "\n"))
	}
	t.Logf("%s: %s equals its SQL answer (%d documents) at %s", when, v.id, len(want), v.cursor)
}

func unionKeys(a, b map[string]any) []string {
	var out []string
	for k := range a {
		out = append(out, k)
	}
	for k := range b {
		if _, ok := a[k]; !ok {
			out = append(out, k)
		}
	}
	sort.Strings(out)
	return out
}

// expectedFrames is what a change of subject from before to after (nil:
// no row) brings a filtered view: an event when the row passes after it,
// a leave when it passed before and no longer does.
func expectedFrames(v *liveView, subject string, before, after map[string]any) []string {
	switch {
	case after != nil && v.pass(after):
		return []string{"event " + subject}
	case before != nil && v.pass(before):
		return []string{"leave " + subject}
	}
	return nil
}

// The filters in Go, as the SQL queries have them.
func passOpenOver100(d map[string]any) bool {
	total, ok := new(big.Rat).SetString(fmt.Sprint(d["total"]))
	return d["status"] == "open" && ok && total.Cmp(big.NewRat(100, 1)) > 0
}

func passGermanNoNote(d map[string]any) bool {
	meta, _ := d["meta"].(map[string]any)
	ship, _ := meta["ship"].(map[string]any)
	note, hasNote := d["note"]
	return ship["country"] == "DE" && hasNote && note == nil
}

func passQtyAtLeast3(d map[string]any) bool {
	n, _ := d["qty"].(json.Number)
	q, err := n.Int64()
	return err == nil && q >= 3
}

// ordersSQL is SELECT … FROM orders WHERE where, each row as the ingest
// encodes it (learned from its events): int8 a number, numeric an exact
// string with its scale, timestamptz RFC 3339 in UTC with +00:00 and no
// trailing zeros in the fraction, jsonb the stored document, NULL null.
func ordersSQL(ctx context.Context, t *testing.T, db *pgx.Conn, where string) map[string]map[string]any {
	t.Helper()
	rows, err := db.Query(ctx, "SELECT id, status, total::text, paid, placed_at, meta::text, note, customer FROM orders WHERE "+where)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]map[string]any{}
	for rows.Next() {
		var id int64
		var status, total, customer string
		var paid bool
		var placed time.Time
		var meta, note *string
		if err := rows.Scan(&id, &status, &total, &paid, &placed, &meta, &note, &customer); err != nil {
			t.Fatal(err)
		}
		out["db.orders."+subjectToken(strconv.FormatInt(id, 10))] = map[string]any{
			"id": json.Number(strconv.FormatInt(id, 10)), "status": status, "total": total, "paid": paid,
			"placed_at": placed.UTC().Format("2006-01-02T15:04:05.999999") + "+00:00",
			"meta":      jsonValue(t, meta), "note": nullable(note), "customer": customer,
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// linesSQL is SELECT … FROM lines WHERE where, by subject.
func linesSQL(ctx context.Context, t *testing.T, db *pgx.Conn, where string) map[string]map[string]any {
	t.Helper()
	rows, err := db.Query(ctx, "SELECT region, code, sku, qty FROM lines WHERE "+where)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]map[string]any{}
	for rows.Next() {
		var region, sku string
		var code int64
		var qty int
		if err := rows.Scan(&region, &code, &sku, &qty); err != nil {
			t.Fatal(err)
		}
		out[lineSubject(region, code)] = map[string]any{
			"region": region, "code": json.Number(strconv.FormatInt(code, 10)), "sku": sku, "qty": json.Number(strconv.Itoa(qty)),
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// lineSubject is a lines row's subject: the key's values escaped each on
// its own, joined with ",".
func lineSubject(region string, code int64) string {
	return "db.lines." + subjectToken(region) + "," + subjectToken(strconv.FormatInt(code, 10))
}

// subjectToken escapes a key value as docs/ingest.md says: ASCII letters,
// digits, _ and - stay, every other byte is %XX, the empty value is %.
func subjectToken(v string) string {
	if v == "" {
		return "%"
	}
	var b strings.Builder
	for i := 0; i < len(v); i++ {
		ch := v[i]
		if ch >= 'a' && ch <= 'z' || ch >= 'A' && ch <= 'Z' || ch >= '0' && ch <= '9' || ch == '_' || ch == '-' {
			b.WriteByte(ch)
		} else {
			fmt.Fprintf(&b, "%%%02X", ch)
		}
	}
	return b.String()
}

func idOf(subject string) int64 {
	id, _ := strconv.ParseInt(subject[strings.LastIndexByte(subject, '.')+1:], 10, 64)
	return id
}

func jsonValue(t *testing.T, s *string) any {
	if s == nil {
		return nil
	}
	dec := json.NewDecoder(strings.NewReader(*s))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		t.Fatal(err)
	}
	return v
}

func nullable(s *string) any {
	if s == nil {
		return nil
	}
	return *s
}

// oddText are customers' names: quotes, backslashes, control characters,
// markup and characters outside the BMP.
var oddText = []string{
	`O'Brien "the" ü 😀 \ ok`, "tab\tnew\nline", "Zoë 日本語", "'; DROP TABLE orders; --", "</script><b>",
	"\u2028\u2029", `\u0041 is not A`, "",
}

// insertOrder inserts order id with values derived from it: half open,
// totals around 100 (4: exactly 100.00), every meta shape, notes and
// NULLs, times with and without fractions.
func insertOrder(ctx context.Context, t *testing.T, db *pgx.Conn, id int64) {
	t.Helper()
	i := id % 1000
	if i < 0 {
		i = -i
	}
	status := []string{"open", "closed", "pending", "open"}[i%4]
	cents := (i*3719)%30000 + 1
	switch id {
	case 4:
		cents = 10000
	case -5, 9007199254740993:
		status, cents = "open", 15000
	}
	metas := []*string{nil,
		ptr(`{"ship": {"country": "DE", "weight": 2.50}, "tags": ["a", "b"]}`),
		ptr(`{"ship": {"country": "FR"}, "n": {"deep": {"er": [1, {"x": null}, 1e3]}}}`),
		ptr(`[]`),
		ptr(`{"b": 1, "a": 2, "ship": {"country": "DE"}}`),
		ptr(`{"ship": {}}`),
	}
	meta := metas[i%6]
	var note *string
	if i%2 == 1 {
		note = ptr("note «" + oddText[i%int64(len(oddText))] + "»")
	}
	if id < 0 || id > 1000 {
		meta, note = metas[1], nil
	}
	placed := time.Date(2024, 5, 1, 10, 34, 56, 789012000, time.UTC).Add(time.Duration(i) * (37*time.Hour + 1234567*time.Microsecond))
	if i%5 == 0 {
		placed = placed.Truncate(time.Second)
	}
	if _, err := db.Exec(ctx, "INSERT INTO orders VALUES ($1, $2, $3::numeric / 100, $4, $5, $6::jsonb, $7, $8)",
		id, status, cents, i%3 == 0, placed, meta, note, oddText[(i+3)%int64(len(oddText))]); err != nil {
		t.Fatal(err)
	}
}

func ptr(s string) *string { return &s }

func execSQL(ctx context.Context, t *testing.T, db *pgx.Conn, sqls ...string) {
	t.Helper()
	for _, q := range sqls {
		if _, err := db.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
}

// churn changes the orders 101..160 one row a transaction (status,
// total, note, the jsonb country; deletes and inserts again) until stop
// is closed, counting the changes in n.
func churn(ctx context.Context, dsn string, stop <-chan struct{}, n *atomic.Int64) error {
	db, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer db.Close(context.Background())
	r := rand.New(rand.NewPCG(25, 25))
	deleted := map[int64]bool{}
	for {
		select {
		case <-stop:
			return nil
		default:
		}
		id := 101 + r.Int64N(60)
		var q string
		switch k := r.IntN(20); {
		case deleted[id]:
			q = fmt.Sprintf(`INSERT INTO orders VALUES (%d, 'open', %d.%02d, true, now(), '{"ship": {"country": "DE"}}', NULL, 'back')`, id, r.IntN(300), r.IntN(100))
			delete(deleted, id)
		case k < 8:
			q = fmt.Sprintf("UPDATE orders SET status = '%s' WHERE id = %d", []string{"open", "closed", "pending"}[r.IntN(3)], id)
		case k < 13:
			q = fmt.Sprintf("UPDATE orders SET total = %d.%02d WHERE id = %d", r.IntN(300), r.IntN(100), id)
		case k < 16:
			q = fmt.Sprintf("UPDATE orders SET note = %s WHERE id = %d", []string{"NULL", "'a note'"}[r.IntN(2)], id)
		case k < 18:
			q = fmt.Sprintf(`UPDATE orders SET meta = '{"ship": {"country": "%s"}}' WHERE id = %d`, []string{"DE", "FR"}[r.IntN(2)], id)
		default:
			q = fmt.Sprintf("DELETE FROM orders WHERE id = %d", id)
			deleted[id] = true
		}
		if _, err := db.Exec(ctx, q); err != nil {
			return fmt.Errorf("%s: %w", q, err)
		}
		n.Add(1)
		time.Sleep(2 * time.Millisecond) // a steady stream, not a flood
	}
}

// waitStored waits until the newest event on subject in the stream CDC
// has doc.n >= n.
func waitStored(ctx context.Context, t *testing.T, url, subject string, n int) {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if st, err := js.Stream(ctx, "CDC"); err == nil {
			if m, err := st.GetLastMsgForSubject(ctx, subject); err == nil {
				var e struct {
					Doc struct {
						N int `json:"n"`
					} `json:"doc"`
				}
				if json.Unmarshal(m.Data, &e) == nil && e.Doc.N >= n {
					return
				}
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s never reached %d in the stream", subject, n)
		}
	}
}
