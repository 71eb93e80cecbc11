package gateway_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fanwire/fanwire/broker/brokertest"
	"github.com/nats-io/nats.go/jetstream"
)

// fanwire.js's live views (issue 25): client.view and filtered
// subscriptions (where, from "latest", leave, synced), against fanwire ws
// processes on JetStream, in Node (view.mjs). Rows are published straight
// into the stream as the ingest writes them ({"op":"insert","key":1,
// "doc":{...}} on db.orders.1); the test keeps its own model of each
// table (every row as its last event left it) and checks each view
// against it, at a synced or once a marker row published last has reached
// the view.

// viewWhere is the filter of the tests' views; openOrder is its twin in Go.
const viewWhere = "doc.status == 'open' && doc.total > 100"

func openOrder(doc map[string]any) bool {
	total, _ := doc["total"].(float64)
	return doc["status"] == "open" && total > 100
}

func everyDoc(map[string]any) bool { return true }

// order is a row of the orders table, as the ingest writes its doc.
func order(id int, status string, total float64) map[string]any {
	return map[string]any{"id": id, "status": status, "total": total}
}

func item(id int, name string) map[string]any { return map[string]any{"id": id, "name": name} }

func orderAt(id int) string { return "db.orders." + strconv.Itoa(id) }
func itemAt(id int) string  { return "db.items." + strconv.Itoa(id) }

// viewNodeArgs are the flags of a node on stream name over db.>.
func viewNodeArgs(url, stream string, more ...string) []string {
	return append([]string{"--broker", "jetstream", "--nats-url", url, "--stream", stream, "--subjects", "db.>", "--allow-anonymous"}, more...)
}

// tables publishes ingest events into the stream and keeps the model:
// every row as its last event left it. One goroutine publishes at a time
// (the model's order is the stream's).
type tables struct {
	js jetstream.JetStream

	mu   sync.Mutex
	rows map[string]map[string]any // subject -> doc; guarded by mu
}

func newTables(js jetstream.JetStream) *tables {
	return &tables{js: js, rows: make(map[string]map[string]any)}
}

func (tb *tables) publish(subject string, event map[string]any) error {
	b, err := json.Marshal(event)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := tb.js.Publish(ctx, subject, b); err != nil {
		return fmt.Errorf("publish %s: %w", subject, err)
	}
	return nil
}

// key is the row key of subject (its last token).
func key(subject string) int {
	k, _ := strconv.Atoi(subject[strings.LastIndexByte(subject, '.')+1:])
	return k
}

// put inserts or updates the row at subject.
func (tb *tables) put(subject string, doc map[string]any) error {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	op := "update"
	if _, ok := tb.rows[subject]; !ok {
		op = "insert"
	}
	if err := tb.publish(subject, map[string]any{"op": op, "key": key(subject), "doc": doc}); err != nil {
		return err
	}
	tb.rows[subject] = normalized(doc)
	return nil
}

// del deletes the row at subject.
func (tb *tables) del(subject string) error {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	if err := tb.publish(subject, map[string]any{"op": "delete", "key": key(subject), "doc": nil, "old": map[string]any{"id": key(subject)}}); err != nil {
		return err
	}
	delete(tb.rows, subject)
	return nil
}

// truncate empties table (db.items): one event on db.items.%truncate.
func (tb *tables) truncate(table string) error {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	if err := tb.publish(table+".%truncate", map[string]any{"op": "truncate", "key": nil, "doc": nil}); err != nil {
		return err
	}
	for s := range tb.rows {
		if strings.HasPrefix(s, table+".") {
			delete(tb.rows, s)
		}
	}
	return nil
}

// forget empties the model: the stream was purged.
func (tb *tables) forget() {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	clear(tb.rows)
}

// want is the view of table (db.orders) through pass: subject -> doc.
func (tb *tables) want(table string, pass func(map[string]any) bool) map[string]any {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	out := make(map[string]any)
	for s, doc := range tb.rows {
		if strings.HasPrefix(s, table+".") && pass(doc) {
			out[s] = doc
		}
	}
	return out
}

// must runs the model's publishes of the test's own goroutine.
func must(t *testing.T, errs ...error) {
	t.Helper()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
}

// normalized is v as JSON gives it back (numbers float64).
func normalized(v map[string]any) map[string]any {
	b, _ := json.Marshal(v)
	var out map[string]any
	_ = json.Unmarshal(b, &out)
	return out
}

// docsOf reads the docs a synced or docs line carries.
func docsOf(t *testing.T, l jsLine) map[string]any {
	t.Helper()
	docs := map[string]any{}
	if err := json.Unmarshal([]byte(l.Message), &docs); err != nil {
		t.Fatalf("the docs of %+v: %v", l, err)
	}
	return docs
}

// checkDocs fails the test unless got equals want, naming the subjects
// that differ.
func checkDocs(t *testing.T, what string, got, want map[string]any) {
	t.Helper()
	if reflect.DeepEqual(got, want) {
		return
	}
	var diffs []string
	for _, s := range slices.Sorted(mapKeys(want, got)) {
		g, gok := got[s]
		w, wok := want[s]
		switch {
		case !gok:
			diffs = append(diffs, fmt.Sprintf("  %s missing, want %v", s, w))
		case !wok:
			diffs = append(diffs, fmt.Sprintf("  %s = %v, want none", s, g))
		case !reflect.DeepEqual(g, w):
			diffs = append(diffs, fmt.Sprintf("  %s = %v, want %v", s, g, w))
		}
	}
	t.Fatalf("%s: the view holds %d documents, want %d:\n%s", what, len(got), len(want), strings.Join(diffs, "\n"))
}

func mapKeys(maps ...map[string]any) func(func(string) bool) {
	return func(yield func(string) bool) {
		seen := map[string]bool{}
		for _, m := range maps {
			for k := range m {
				if !seen[k] {
					seen[k] = true
					if !yield(k) {
						return
					}
				}
			}
		}
	}
}

// viewSub is the id of view name's subscription.
func viewSub(t *testing.T, r *nodeRun, name string) string {
	t.Helper()
	i, l := find(r.all(), "view", name)
	if i < 0 {
		t.Fatalf("no view %s:\n%s", name, r.summary())
	}
	return l.Subject
}

// sentFrame is a subscribe the client sent, and where among its lines.
type sentFrame struct {
	at    int
	ID    string  `json:"id"`
	Where *string `json:"where"`
	From  *string `json:"from"`
}

// sent returns the subscribes sent for subscription id, in order.
func sent(t *testing.T, lines []jsLine, id string) []sentFrame {
	t.Helper()
	var out []sentFrame
	for i, l := range lines {
		if l.K != "sent" {
			continue
		}
		var f sentFrame
		if err := json.Unmarshal([]byte(l.Message), &f); err != nil {
			t.Fatalf("sent %q: %v", l.Message, err)
		}
		if f.ID == id {
			f.at = i
			out = append(out, f)
		}
	}
	return out
}

func str(p *string) string {
	if p == nil {
		return "<none>"
	}
	return strconv.Quote(*p)
}

// changes returns view name's changes among lines, as "upsert db.orders.2".
func changes(lines []jsLine, name string) []string {
	var out []string
	for _, l := range subLines(lines, "change", name) {
		out = append(out, l.State+" "+l.Subject)
	}
	return out
}

// syncedAfter returns view name's synced lines after index from.
func syncedAfter(lines []jsLine, name string, from int) []jsLine {
	if from+1 > len(lines) {
		return nil
	}
	return subLines(lines[from+1:], "synced", name)
}

// lastIndex is the index of the last line of kind k (and state, when
// given), or -1.
func lastIndex(lines []jsLine, k, state string) int {
	for i := len(lines) - 1; i >= 0; i-- {
		if lines[i].K == k && (state == "" || lines[i].State == state) {
			return i
		}
	}
	return -1
}

// checkResumes checks every subscribe of view name after its first: it
// carries the view's filter, and from the cursor the view had when the
// connection before it ended (the cursor line printed then), never
// "latest" (a new snapshot), unless the view's cursor expired (a gap
// between them). It returns how many resumes it checked.
func checkResumes(t *testing.T, r *nodeRun, name, where string) int {
	t.Helper()
	lines := r.all()
	id := viewSub(t, r, name)
	frames := sent(t, lines, id)
	if len(frames) == 0 || str(frames[0].From) != `"latest"` {
		t.Fatalf("view %s's first subscribe: want from \"latest\", got %+v:\n%s", name, frames, r.summary())
	}
	for i, f := range frames {
		if (where == "" && f.Where != nil) || (where != "" && str(f.Where) != strconv.Quote(where)) {
			t.Fatalf("view %s's subscribe %d carries where %s, want %q", name, i+1, str(f.Where), where)
		}
		if i == 0 {
			continue
		}
		// Without a disconnect between (a subscribe the gateway dropped or
		// could not start, sent again), nothing was delivered: the same from.
		cursor := ""
		if frames[i-1].From != nil {
			cursor = *frames[i-1].From
		}
		for j := f.at - 1; j > frames[i-1].at; j-- {
			if lines[j].K == "cursor" && lines[j].Sub == name {
				cursor = lines[j].Cursor
				break
			}
		}
		if str(f.From) != strconv.Quote(cursor) {
			t.Fatalf("view %s's subscribe %d after a reconnect: from %s, want its cursor %q (a resume, not a new snapshot):\n%s", name, i+1, str(f.From), cursor, r.summary())
		}
	}
	return len(frames) - 1
}

// TestClientView: live views in Node against fanwire ws on JetStream.
func TestClientView(t *testing.T) {
	t.Parallel() // it mostly waits for its own processes (Node, Chromium, nodes): beside the others
	node := requireClientFixture(t)
	bin := buildFanwire(t)
	clientCfg := func(url string) map[string]any {
		return map[string]any{"urls": []string{url}, "options": map[string]any{"backoff": map[string]any{"initial": 50, "max": 500}}}
	}

	t.Run("a filtered view across reconnects", func(t *testing.T) {
		url := brokertest.NATS(t).ClientURL()
		js := brokertest.JetStream(t, url)
		n := startGateway(t, bin, viewNodeArgs(url, "VIEWS")...)
		p := brokertest.StartProxy(t, n.addr, brokertest.ProxyConfig{})
		tb := newTables(js)

		// Before the views: orders 1..12, open unless a multiple of 3,
		// totalling 40 each; then changes the snapshot must show as they
		// end. Items 1..3, a truncate, items 4 and 5.
		for i := 1; i <= 12; i++ {
			status := "open"
			if i%3 == 0 {
				status = "closed"
			}
			must(t, tb.put(orderAt(i), order(i, status, float64(40*i))))
		}
		must(t,
			tb.put(orderAt(3), order(3, "open", 120)),   // enters
			tb.put(orderAt(4), order(4, "closed", 160)), // leaves
			tb.del(orderAt(5)),                          // leaves
			tb.put(orderAt(1), order(1, "open", 100.5)), // enters: a double over the int 100
			tb.put(orderAt(2), order(2, "open", 100)),   // not over 100
			tb.put(itemAt(1), item(1, "a")), tb.put(itemAt(2), item(2, "b")), tb.put(itemAt(3), item(3, "c")),
			tb.truncate("db.items"),
			tb.put(itemAt(4), item(4, "d")), tb.put(itemAt(5), item(5, "e")),
		)
		wantOpen := map[string]any{orderAt(1): nil, orderAt(3): nil, orderAt(7): nil, orderAt(8): nil, orderAt(10): nil, orderAt(11): nil}
		if got := tb.want("db.orders", openOrder); !slices.Equal(slices.Sorted(mapKeys(got)), slices.Sorted(mapKeys(wantOpen))) {
			t.Fatalf("the test's model is off: open orders %v", slices.Sorted(mapKeys(got)))
		}

		r := runScript(t, node, nil, "view.mjs", clientCfg("ws://"+p.Addr()+"/ws"), nil)
		r.send(map[string]any{"cmd": "view", "name": "open", "pattern": "db.orders.*", "where": viewWhere, "ready": true})
		r.send(map[string]any{"cmd": "view", "name": "items", "pattern": "db.items.*", "ready": true})
		apiWait(r, "both views ready", func(l []jsLine) bool {
			return (has(l, "view_ready", "open") || has(l, "view_ready_error", "open")) && (has(l, "view_ready", "items") || has(l, "view_ready_error", "items"))
		})
		lines := r.all()
		for _, v := range []struct {
			name, table string
			pass        func(map[string]any) bool
		}{{"open", "db.orders", openOrder}, {"items", "db.items", everyDoc}} {
			i, synced := find(lines, "synced", v.name)
			if i < 0 || synced.Cursor == "" {
				t.Fatalf("view %s ready without a synced carrying a cursor:\n%s", v.name, r.summary())
			}
			checkDocs(t, v.name+" at its first synced", docsOf(t, synced), tb.want(v.table, v.pass))
		}

		// Live: out of the filter (a leave), into it, a delete (a leave on
		// the filtered view, the delete event on the other), an update.
		before := len(lines)
		must(t,
			tb.put(orderAt(7), order(7, "closed", 280)),
			tb.put(orderAt(2), order(2, "open", 500)),
			tb.del(orderAt(8)),
			tb.put(orderAt(10), order(10, "open", 401)),
			tb.del(itemAt(4)),
			tb.put(itemAt(6), item(6, "f")),
		)
		wantChanges := map[string][]string{
			"open":  {"remove db.orders.7", "upsert db.orders.2", "remove db.orders.8", "upsert db.orders.10"},
			"items": {"remove db.items.4", "upsert db.items.6"},
		}
		apiWait(r, "the live changes", func(l []jsLine) bool {
			return len(changes(l[before:], "open")) >= 4 && len(changes(l[before:], "items")) >= 2
		})
		for name, want := range wantChanges {
			if got := changes(r.all()[before:], name); !slices.Equal(got, want) {
				t.Fatalf("view %s's live changes: %v, want %v:\n%s", name, got, want, r.summary())
			}
		}
		checkBoth := func(what string) {
			t.Helper()
			before := len(r.all())
			r.send(map[string]any{"cmd": "docs", "name": "open"})
			r.send(map[string]any{"cmd": "docs", "name": "items"})
			apiWait(r, "the docs", func(l []jsLine) bool { return has(l[before:], "docs", "open") && has(l[before:], "docs", "items") })
			lines := r.all()[before:]
			_, open := find(lines, "docs", "open")
			_, items := find(lines, "docs", "items")
			checkDocs(t, "open "+what, docsOf(t, open), tb.want("db.orders", openOrder))
			checkDocs(t, "items "+what, docsOf(t, items), tb.want("db.items", everyDoc))
		}
		checkBoth("after the live changes")

		// The node dies; while it is down, the rows change; it comes back.
		n.stop(syscall.SIGKILL)
		apiWait(r, "the disconnect", func(l []jsLine) bool { return has(l, "cursor", "open") && has(l, "cursor", "items") })
		down := lastIndex(r.all(), "state", "disconnected")
		must(t,
			tb.put(orderAt(10), order(10, "closed", 401)), // leaves
			tb.put(orderAt(6), order(6, "open", 240)),     // enters
			tb.del(orderAt(11)),                           // leaves
			tb.put(orderAt(1), order(1, "open", 150)),     // changes
			tb.put(orderAt(13), order(13, "open", 700)),   // new, in
			tb.put(orderAt(14), order(14, "closed", 700)), // new, out
			tb.put(orderAt(9), order(9, "closed", 361)),   // out, stays out
			tb.put(orderAt(12), order(12, "open", 480)),   // enters and leaves again
			tb.put(orderAt(12), order(12, "closed", 480)),
			tb.truncate("db.items"),
			tb.put(itemAt(7), item(7, "g")),
		)
		n.start()
		apiWait(r, "both views synced again", func(l []jsLine) bool {
			return len(syncedAfter(l, "open", down)) > 0 && len(syncedAfter(l, "items", down)) > 0
		})
		lines = r.all()
		for _, v := range []struct {
			name, table      string
			pass             func(map[string]any) bool
			removes, upserts []string
		}{
			// The documents that changed while the client was away come
			// again (2 and 3 did not: they are kept, not re-sent); those
			// that left are dropped at synced, told as removes.
			{"open", "db.orders", openOrder, []string{"remove db.orders.10", "remove db.orders.11"}, []string{"upsert db.orders.1", "upsert db.orders.13", "upsert db.orders.6"}},
			{"items", "db.items", everyDoc, []string{"remove db.items.5", "remove db.items.6"}, []string{"upsert db.items.7"}},
		} {
			synced := syncedAfter(lines, v.name, down)[0]
			checkDocs(t, v.name+" at the synced after the node's restart", docsOf(t, synced), tb.want(v.table, v.pass))
			var removes, upserts []string
			for _, c := range changes(lines[down:], v.name) {
				if strings.HasPrefix(c, "remove") {
					removes = append(removes, c)
				} else {
					upserts = append(upserts, c)
				}
			}
			sort.Strings(removes)
			sort.Strings(upserts)
			if !slices.Equal(removes, v.removes) || !slices.Equal(upserts, v.upserts) {
				t.Fatalf("view %s across the restart: changes %v and %v, want %v and %v:\n%s", v.name, removes, upserts, v.removes, v.upserts, r.summary())
			}
		}
		checkResumes(t, r, "open", viewWhere)
		checkResumes(t, r, "items", "")

		// Rows change all the time while the connection is cut three
		// times: after a synced, right after a resubscribe was sent (in
		// the middle of its catch-up, or just after it), and after a
		// synced again.
		const seed = 25
		t.Logf("random changes from seed %d", seed)
		rng := rand.New(rand.NewPCG(seed, 0))
		ctx, stop := context.WithCancel(context.Background())
		var published int
		var pubErr error
		done := make(chan struct{})
		go func() {
			defer close(done)
			for ctx.Err() == nil {
				var err error
				switch x := rng.IntN(100); {
				case x < 65:
					status := []string{"open", "closed"}[rng.IntN(2)]
					total := float64(rng.IntN(300))
					if rng.IntN(4) == 0 {
						total += 0.5
					}
					k := 1 + rng.IntN(30)
					err = tb.put(orderAt(k), order(k, status, total))
				case x < 75:
					err = tb.del(orderAt(1 + rng.IntN(30)))
				case x < 92:
					k := 1 + rng.IntN(10)
					err = tb.put(itemAt(k), item(k, strconv.Itoa(rng.IntN(1000))))
				case x < 98:
					err = tb.del(itemAt(1 + rng.IntN(10)))
				default:
					err = tb.truncate("db.items")
				}
				if err != nil {
					pubErr = err
					return
				}
				published++
				time.Sleep(2 * time.Millisecond) // a steady flow, not a flood
			}
		}()
		stopPublishing := func() {
			stop()
			<-done
			if pubErr != nil {
				t.Fatal(pubErr)
			}
		}
		defer stopPublishing()
		// cut ends the client's connection and returns how many
		// disconnects the client had told before; resynced waits for a
		// later one, a connection after it, and both views synced on it.
		cut := func() int {
			downs := count(r.all(), "state", "disconnected")
			p.Cut(p.Conns())
			return downs
		}
		resynced := func(what string, downs int) {
			t.Helper()
			apiWait(r, what, func(l []jsLine) bool {
				down := lastIndex(l, "state", "disconnected")
				return count(l, "state", "disconnected") > downs && lastIndex(l, "state", "connected") > down &&
					len(syncedAfter(l, "open", down)) > 0 && len(syncedAfter(l, "items", down)) > 0
			})
		}
		from := len(r.all())
		apiWait(r, "changes flowing", func(l []jsLine) bool { return count(l[from:], "change", "") >= 50 })
		resynced("both views synced after the first cut", cut())
		sentBefore := count(r.all(), "sent", "")
		cut()
		apiWait(r, "both views resubscribing", func(l []jsLine) bool { return count(l, "sent", "") >= sentBefore+2 })
		resynced("both views synced after the second cut", cut())
		from = len(r.all())
		apiWait(r, "changes flowing", func(l []jsLine) bool { return count(l[from:], "change", "") >= 50 })
		resynced("both views synced after the third cut", cut())
		stopPublishing()
		t.Logf("%d random changes published", published)

		// A marker row in each table, published last, reaches the views
		// after every change before it.
		from = len(r.all())
		must(t, tb.put(orderAt(999), order(999, "open", 1000)), tb.put(itemAt(999), item(999, "marker")))
		apiWait(r, "the markers", func(l []jsLine) bool {
			c := slices.Concat(changes(l[from:], "open"), changes(l[from:], "items"))
			return slices.Contains(c, "upsert db.orders.999") && slices.Contains(c, "upsert db.items.999")
		})
		checkBoth("after the random changes and the cuts")
		if got := checkResumes(t, r, "open", viewWhere); got < 4 {
			t.Fatalf("view open resumed %d times, want at least 4 (the restart and three cuts)", got)
		}
		checkResumes(t, r, "items", "")
		for _, l := range r.all() {
			if l.K == "gap" || l.K == "error" || l.K == "view_error" {
				t.Fatalf("a %s: %+v\n%s", l.K, l, r.summary())
			}
		}
	})

	t.Run("a view whose cursor expired starts again", func(t *testing.T) {
		// Two views of one table: all, without a filter, resumes by
		// replaying every event after its cursor, so it needs the stream's
		// history; open, filtered, resumes with the documents changed
		// since its cursor and synced's keys (a snapshot), which needs none.
		url := brokertest.NATS(t).ClientURL()
		js := brokertest.JetStream(t, url)
		n := startGateway(t, bin, viewNodeArgs(url, "VIEWEXP")...)
		tb := newTables(js)
		must(t,
			tb.put(orderAt(1), order(1, "open", 150)),
			tb.put(orderAt(2), order(2, "open", 200)),
			tb.put(orderAt(3), order(3, "closed", 300)),
			tb.put(orderAt(4), order(4, "open", 400)),
			tb.put(orderAt(5), order(5, "open", 50)),
			tb.put(orderAt(6), order(6, "open", 600)),
		)
		r := runScript(t, node, nil, "view.mjs", clientCfg(n.wsURL()), nil)
		r.send(map[string]any{"cmd": "view", "name": "all", "pattern": "db.orders.*", "ready": true})
		r.send(map[string]any{"cmd": "view", "name": "open", "pattern": "db.orders.*", "where": viewWhere, "ready": true})
		apiWait(r, "the views ready", func(l []jsLine) bool {
			return (has(l, "view_ready", "all") || has(l, "view_ready_error", "all")) && (has(l, "view_ready", "open") || has(l, "view_ready_error", "open"))
		})
		for _, v := range []struct {
			name string
			pass func(map[string]any) bool
		}{{"all", everyDoc}, {"open", openOrder}} {
			i, synced := find(r.all(), "synced", v.name)
			if i < 0 {
				t.Fatalf("view %s did not become ready:\n%s", v.name, r.summary())
			}
			checkDocs(t, v.name+" at the first synced", docsOf(t, synced), tb.want("db.orders", v.pass))
		}

		// While the node is down, the stream moves on and is purged: the
		// views' cursor is older than anything it holds.
		n.stop(syscall.SIGKILL)
		apiWait(r, "the disconnect", func(l []jsLine) bool { return has(l, "cursor", "all") && has(l, "cursor", "open") })
		_, c := find(r.all(), "cursor", "all")
		down := lastIndex(r.all(), "state", "disconnected")
		must(t, tb.put(orderAt(1), order(1, "open", 151)), tb.put(orderAt(3), order(3, "open", 301)))
		stream, err := js.Stream(context.Background(), "VIEWEXP")
		if err != nil {
			t.Fatal(err)
		}
		if err := stream.Purge(context.Background()); err != nil {
			t.Fatal(err)
		}
		tb.forget()
		must(t,
			tb.put(orderAt(2), order(2, "open", 300)),
			tb.put(orderAt(7), order(7, "open", 400)),
			tb.put(orderAt(8), order(8, "closed", 500)),
		)
		n.start()
		apiWait(r, "the views synced again", func(l []jsLine) bool {
			return len(syncedAfter(l, "all", down)) > 0 && len(syncedAfter(l, "open", down)) > 0
		})
		lines := r.all()
		all, open := viewSub(t, r, "all"), viewSub(t, r, "open")
		if gapAt, gap := find(lines[down:], "gap", all); gapAt < 0 || gap.Reason != "cursor_expired" || gap.Cursor != c.Cursor {
			t.Fatalf("view all: want a gap cursor_expired with its cursor %s:\n%s", c.Cursor, r.summary())
		}
		frames := sent(t, lines, all)
		if len(frames) != 3 || str(frames[1].From) != strconv.Quote(c.Cursor) || str(frames[2].From) != `"latest"` || frames[2].Where != nil {
			t.Fatalf(`view all: want three subscribes: from "latest", from its cursor %s, and from "latest" again; got %+v:`+"\n%s", c.Cursor, frames, r.summary())
		}
		if has(lines, "gap", open) || checkResumes(t, r, "open", viewWhere) != 1 {
			t.Fatalf("view open: want one resume, from its cursor, and no gap:\n%s", r.summary())
		}
		for _, v := range []struct {
			name    string
			pass    func(map[string]any) bool
			removes []string
		}{
			// all is replaced at the new snapshot's synced; open drops
			// what synced's keys do not list.
			{"all", everyDoc, []string{"remove db.orders.1", "remove db.orders.3", "remove db.orders.4", "remove db.orders.5", "remove db.orders.6"}},
			{"open", openOrder, []string{"remove db.orders.1", "remove db.orders.4", "remove db.orders.6"}},
		} {
			synced := syncedAfter(lines, v.name, down)[0]
			checkDocs(t, v.name+" at the synced after the purge", docsOf(t, synced), tb.want("db.orders", v.pass))
			var removes []string
			for _, ch := range changes(lines[down:], v.name) {
				if strings.HasPrefix(ch, "remove") {
					removes = append(removes, ch)
				}
			}
			sort.Strings(removes)
			if !slices.Equal(removes, v.removes) {
				t.Fatalf("view %s after the purge: removes %v, want %v:\n%s", v.name, removes, v.removes, r.summary())
			}
		}
	})

	t.Run("a view of an empty stream", func(t *testing.T) {
		// Synced without a cursor: there is nothing to resume from, so
		// after a reconnect the view reads the newest events again.
		url := brokertest.NATS(t).ClientURL()
		js := brokertest.JetStream(t, url)
		n := startGateway(t, bin, viewNodeArgs(url, "VIEWEMPTY")...)
		tb := newTables(js)
		r := runScript(t, node, nil, "view.mjs", clientCfg(n.wsURL()), nil)
		r.send(map[string]any{"cmd": "view", "name": "open", "pattern": "db.orders.*", "where": viewWhere, "ready": true})
		apiWait(r, "the view ready", func(l []jsLine) bool { return has(l, "view_ready", "open") || has(l, "view_ready_error", "open") })
		if i, synced := find(r.all(), "synced", "open"); i < 0 || synced.Cursor != "" || synced.Data.N != 0 {
			t.Fatalf("a view of an empty stream: want it synced, without a cursor, empty:\n%s", r.summary())
		}
		n.stop(syscall.SIGKILL)
		apiWait(r, "the disconnect", func(l []jsLine) bool { return has(l, "cursor", "open") })
		down := lastIndex(r.all(), "state", "disconnected")
		must(t, tb.put(orderAt(1), order(1, "open", 150)), tb.put(orderAt(2), order(2, "closed", 150)))
		n.start()
		apiWait(r, "the view synced again", func(l []jsLine) bool { return len(syncedAfter(l, "open", down)) > 0 })
		lines := r.all()
		frames := sent(t, lines, viewSub(t, r, "open"))
		if len(frames) != 2 || str(frames[1].From) != `"latest"` || str(frames[1].Where) != strconv.Quote(viewWhere) {
			t.Fatalf(`want the resubscribe from "latest" with the filter, got %+v:`+"\n%s", frames, r.summary())
		}
		checkDocs(t, "at the synced after the restart", docsOf(t, syncedAfter(lines, "open", down)[0]), tb.want("db.orders", openOrder))
	})

	t.Run("a filtered subscription", func(t *testing.T) {
		url := brokertest.NATS(t).ClientURL()
		js := brokertest.JetStream(t, url)
		n := startGateway(t, bin, viewNodeArgs(url, "VIEWSUB")...)
		p := brokertest.StartProxy(t, n.addr, brokertest.ProxyConfig{})
		tb := newTables(js)
		must(t,
			tb.put(orderAt(1), order(1, "open", 150)),
			tb.put(orderAt(2), order(2, "closed", 150)),
			tb.put(orderAt(3), order(3, "open", 200)),
			tb.put(orderAt(4), order(4, "open", 50)),
		)
		r := runScript(t, node, nil, "view.mjs", clientCfg("ws://"+p.Addr()+"/ws"), nil)
		r.send(map[string]any{"cmd": "subscribe", "name": "f", "pattern": "db.orders.*", "options": map[string]any{"where": viewWhere, "from": "latest"}})
		apiWait(r, "f synced", func(l []jsLine) bool { return has(l, "sub_synced", "f") })
		lines := r.all()
		var got []string
		for _, l := range subLines(lines, "event", "f") {
			got = append(got, l.Subject)
		}
		sort.Strings(got)
		_, synced := find(lines, "sub_synced", "f")
		if !slices.Equal(got, []string{orderAt(1), orderAt(3)}) || synced.Cursor == "" || synced.Message != "" {
			t.Fatalf(`from "latest" with a filter: events %v, want db.orders.1 and db.orders.3, then a synced with a cursor and no keys:`+"\n%s", got, r.summary())
		}

		must(t, tb.put(orderAt(3), order(3, "closed", 200)), tb.put(orderAt(2), order(2, "open", 300)))
		apiWait(r, "the leave and the event", func(l []jsLine) bool {
			return has(l, "leave", "f") && len(subLines(l, "event", "f")) >= 3
		})
		lines = r.all()
		leaveAt, leave := find(lines, "leave", "f")
		last := subLines(lines, "event", "f")[2]
		if leave.Subject != orderAt(3) || leave.Cursor == "" || leave.State != "advanced" || last.Subject != orderAt(2) || leaveAt > lastIndex(lines, "event", "") {
			t.Fatalf("want a leave of db.orders.3 with a cursor, which the subscription's cursor took, then db.orders.2's event:\n%s", r.summary())
		}

		// Resumed after a cut: from the last cursor, with the filter; its
		// synced lists the subjects in the view.
		p.Cut(p.Conns())
		apiWait(r, "f synced again", func(l []jsLine) bool { return len(subLines(l, "sub_synced", "f")) >= 2 })
		lines = r.all()
		frames := sent(t, lines, "s1")
		if len(frames) != 2 || str(frames[1].From) != strconv.Quote(last.Cursor) || str(frames[1].Where) != strconv.Quote(viewWhere) {
			t.Fatalf("want the resubscribe from %s with the filter, got %+v:\n%s", last.Cursor, frames, r.summary())
		}
		var keys []string
		if err := json.Unmarshal([]byte(subLines(lines, "sub_synced", "f")[1].Message), &keys); err != nil {
			t.Fatalf("the resumed synced's keys: %v:\n%s", err, r.summary())
		}
		sort.Strings(keys)
		if !slices.Equal(keys, []string{orderAt(1), orderAt(2)}) {
			t.Fatalf("the resumed synced's keys: %v, want db.orders.1 and db.orders.2", keys)
		}
	})

	t.Run("errors end a view", func(t *testing.T) {
		url := brokertest.NATS(t).ClientURL()
		js := brokertest.JetStream(t, url)
		n := startGateway(t, bin, viewNodeArgs(url, "VIEWERR", "--max-snapshot", "3")...)
		tb := newTables(js)
		for i := 1; i <= 5; i++ {
			must(t, tb.put(orderAt(i), order(i, "open", 200)))
		}
		r := runScript(t, node, nil, "view.mjs", clientCfg(n.wsURL()), nil)
		for _, v := range []struct{ name, where, code string }{
			{"bad", "doc.status ==", "bad_filter"},
			{"big", viewWhere, "view_too_large"}, // 5 documents in the snapshot
		} {
			r.send(map[string]any{"cmd": "view", "name": v.name, "pattern": "db.orders.*", "where": v.where, "ready": true})
			apiWait(r, v.name+".ready()", func(l []jsLine) bool { return has(l, "view_ready", v.name) || has(l, "view_ready_error", v.name) })
			lines := r.all()
			_, ready := find(lines, "view_ready_error", v.name)
			_, ended := find(lines, "view_error", v.name)
			if ready.Code != v.code || ended.Code != v.code || ended.State != "closed" {
				t.Fatalf("a view with where %q: want ready() rejected with %s, and the view's error %s with the view closed:\n%s", v.where, v.code, v.code, r.summary())
			}
			t.Logf("%s: %s", v.code, ended.Message)
		}

		// A view that grows past --max-snapshot once live.
		must(t, tb.put(orderAt(6), order(6, "open", 900)), tb.put(orderAt(7), order(7, "open", 900)))
		r.send(map[string]any{"cmd": "view", "name": "grows", "pattern": "db.orders.*", "where": "doc.total > 500", "ready": true})
		apiWait(r, "grows.ready()", func(l []jsLine) bool { return has(l, "view_ready", "grows") || has(l, "view_ready_error", "grows") })
		if i, synced := find(r.all(), "synced", "grows"); i < 0 || synced.Data.N != 2 {
			t.Fatalf("grows: want it synced with 2 documents:\n%s", r.summary())
		}
		must(t, tb.put(orderAt(8), order(8, "open", 900)), tb.put(orderAt(9), order(9, "open", 900)))
		apiWait(r, "grows ended", func(l []jsLine) bool { return has(l, "view_error", "grows") })
		if _, ended := find(r.all(), "view_error", "grows"); ended.Code != "view_too_large" || ended.State != "closed" {
			t.Fatalf("a view past --max-snapshot once live: want it ended with view_too_large:\n%s", r.summary())
		}
		waitFor(t, "the node to hold no subscription", func() bool { return nodeMetric(t, n, "fanwire_subscriptions") == 0 })
		for _, name := range []string{"bad", "big", "grows"} {
			if frames := sent(t, r.all(), viewSub(t, r, name)); len(frames) != 1 {
				t.Fatalf("view %s, ended by an error, subscribed %d times, want once", name, len(frames))
			}
		}
	})
}

// TestClientViewTypes: fanwire.d.ts refuses misuses of the view API
// (example.ts, which TestClientTypes checks, uses it right).
func TestClientViewTypes(t *testing.T) {
	t.Parallel() // it mostly waits for its own processes (Node, Chromium, nodes): beside the others
	node := requireClientFixture(t)
	misuses := []struct{ line, why string }{
		{`c.view("a.>", {where: 7});`, "where: 7"},
		{`c.view("a.>", {from: "first"});`, "a view's from"},
		{`c.view("a.>").on("event", () => {});`, `view.on("event")`},
		{`c.view<number>("a.>").docs.set("a.b", 1);`, "docs.set: docs is the view's"},
		{`c.view<{n: number}>("a.>").on("change", (ch) => { const s: string = ch.doc.n; void s; });`, "a change's doc of the wrong type"},
		{`c.view("a.>").on("change", (ch) => { if (ch.type === "insert") return; });`, `a change of type "insert"`},
		{`c.subscribe("a.>", {resync: "never"});`, `resync: "never"`},
		{`c.subscribe("a.>").on("leave", (subject: number) => subject);`, "a leave's subject as a number"},
		{`c.subscribe("a.>").on("synced", (cursor, keys: number[]) => keys);`, "synced's keys as numbers"},
	}
	src := `import {connect} from "` + absPath(t, "client/fanwire.js") + `";
const c = connect("ws://x/ws");
`
	for _, m := range misuses {
		src += m.line + "\n"
	}
	bad := filepath.Join(t.TempDir(), "bad.ts")
	if err := os.WriteFile(bad, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	tsc := filepath.Join("node_modules", "typescript", "bin", "tsc")
	cmd := exec.Command(node, tsc, "--noEmit", "--strict", "--module", "NodeNext", "--moduleResolution", "NodeNext", "--target", "ES2022", "--types", "node", bad)
	cmd.Dir = clientFixture
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("tsc accepted a misuse of the view API:\n%s", src)
	}
	for i, m := range misuses {
		if !strings.Contains(string(out), fmt.Sprintf("bad.ts(%d,", i+3)) {
			t.Errorf("tsc let %s through (line %d: %s):\n%s", m.why, i+3, m.line, out)
		}
	}
}
