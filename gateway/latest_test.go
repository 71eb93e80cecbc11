package gateway_test

import (
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"testing"

	"github.com/fanwire/fanwire/gateway"
)

// viewState is a client's view built from frames, as fanwire.js builds
// it: events upsert data.doc by subject (a delete removes), leaves remove,
// a synced with keys drops what it does not list.
type viewState struct {
	docs    map[string]string // subject → doc JSON
	cursors map[string]string // subject → cursor of its last frame
	synced  string
}

func newViewState() *viewState {
	return &viewState{docs: map[string]string{}, cursors: map[string]string{}}
}

// read applies frames for subscription id until its synced (or, with
// untilSynced false, n frames).
func (v *viewState) apply(t *testing.T, m map[string]any) {
	t.Helper()
	subj, _ := m["subject"].(string)
	switch m["type"] {
	case "event":
		data, _ := m["data"].(map[string]any)
		if data["op"] == "delete" {
			delete(v.docs, subj)
		} else {
			b, _ := json.Marshal(data["doc"])
			v.docs[subj] = string(b)
		}
		v.cursors[subj], _ = m["cursor"].(string)
	case "leave":
		if _, ok := v.docs[subj]; !ok {
			t.Fatalf("a leave for %s, which the view does not hold", subj)
		}
		delete(v.docs, subj)
	case "synced":
		v.synced, _ = m["cursor"].(string)
		if keys, ok := m["keys"].([]any); ok {
			keep := map[string]bool{}
			for _, k := range keys {
				keep[k.(string)] = true
			}
			for s := range v.docs {
				if !keep[s] {
					delete(v.docs, s)
				}
			}
			for k := range keep {
				if _, ok := v.docs[k]; !ok {
					t.Fatalf("synced lists %s, which the view never got", k)
				}
			}
		}
	default:
		t.Fatalf("unexpected frame %v", m)
	}
}

// untilSynced reads frames of a view subscription up to its synced.
func (v *viewState) untilSynced(t *testing.T, cl *client) {
	t.Helper()
	for {
		m := cl.next()
		v.apply(t, m)
		if m["type"] == "synced" {
			return
		}
	}
}

func doc(status string, total int) string {
	return fmt.Sprintf(`{"status":%q,"total":%d}`, status, total)
}

// TestLatestSnapshotAndDeltaResume: from:"latest" sends each subject's
// newest event (deletes left out), then synced; with where, only what
// passes, then leaves; a filtered view's resume from its cursor sends the
// documents that changed since, and synced's keys let the client drop
// those that left while it was away. On JetStream and Redis Streams.
func TestLatestSnapshotAndDeltaResume(t *testing.T) {
	for _, kind := range []string{"jetstream", "redis"} {
		t.Run(kind, func(t *testing.T) {
			e := newEnvOn(t, kind, func(c *gateway.Config) { c.Subjects = []string{"orders.>", "app.>"} })
			e.store("orders.1", row("insert", 1, doc("open", 10)))
			e.store("orders.2", row("insert", 2, doc("open", 200)))
			e.store("orders.1", row("update", 1, doc("open", 150)))
			e.store("orders.3", row("insert", 3, doc("open", 300)))
			e.store("orders.3", row("delete", 3, ""))
			e.store("orders.4", row("insert", 4, doc("closed", 400)))
			last := e.store("app.x", `{"not":"an order"}`)

			cl := e.dial()
			cl.keepSynced = true
			cl.send(`{"type":"subscribe","id":"all","subject":"orders.*","from":"latest"}`)
			cl.expect(map[string]any{"type": "subscribed", "id": "all"})
			all := newViewState()
			all.untilSynced(t, cl)
			want := map[string]string{"orders.1": doc("open", 150), "orders.2": doc("open", 200), "orders.4": doc("closed", 400)}
			if !mapsEqualJSON(all.docs, want) {
				t.Fatalf("snapshot %v, want %v", all.docs, want)
			}
			if all.synced != last {
				t.Fatalf("synced at %q, want the stream's last cursor %q", all.synced, last)
			}

			cl.send(`{"type":"subscribe","id":"v","subject":"orders.*","where":"doc.status == 'open' && doc.total > 100","from":"latest"}`)
			cl.expect(map[string]any{"type": "subscribed", "id": "v"})
			v := newViewState()
			v.untilSynced(t, cl)
			if want := map[string]string{"orders.1": doc("open", 150), "orders.2": doc("open", 200)}; !mapsEqualJSON(v.docs, want) {
				t.Fatalf("filtered snapshot %v, want %v", v.docs, want)
			}
			cl.send(`{"type":"unsubscribe","id":"all"}`)
			cl.expect(map[string]any{"type": "unsubscribed", "id": "all"})
			e.store("orders.2", row("update", 2, doc("closed", 200)))
			m := cl.expect(map[string]any{"type": "leave", "subject": "orders.2", "subs": []any{"v"}})
			v.apply(t, m)

			// The client goes away; meanwhile orders.1 leaves (and comes
			// back changed), orders.2 comes back, orders.5 enters, orders.6
			// enters and is deleted, orders.4 changes and stays out.
			cl.send(`{"type":"unsubscribe","id":"v"}`)
			cl.expect(map[string]any{"type": "unsubscribed", "id": "v"})
			e.store("orders.1", row("update", 1, doc("closed", 150)))
			e.store("orders.2", row("update", 2, doc("open", 250)))
			e.store("orders.5", row("insert", 5, doc("open", 500)))
			e.store("orders.6", row("insert", 6, doc("open", 600)))
			e.store("orders.6", row("delete", 6, ""))
			e.store("orders.4", row("update", 4, doc("closed", 450)))
			e.store("orders.7", row("insert", 7, doc("open", 700)))
			e.store("orders.7", row("update", 7, doc("open", 5)))

			again := e.dial()
			again.keepSynced = true
			again.send(`{"type":"subscribe","id":"v","subject":"orders.*","where":"doc.status == 'open' && doc.total > 100","from":"` + m["cursor"].(string) + `"}`)
			again.expect(map[string]any{"type": "subscribed", "id": "v", "cursor": m["cursor"]})
			var sent []string
			for {
				f := again.next()
				if f["type"] == "event" {
					sent = append(sent, f["subject"].(string))
				}
				v.apply(t, f)
				if f["type"] == "synced" {
					break
				}
			}
			if want := []string{"orders.2", "orders.5"}; !slices.Equal(sent, want) {
				t.Fatalf("the resume sent %v, want only the documents changed since the cursor that pass: %v", sent, want)
			}
			if want := map[string]string{"orders.2": doc("open", 250), "orders.5": doc("open", 500)}; !mapsEqualJSON(v.docs, want) {
				t.Fatalf("view after the resume %v, want %v", v.docs, want)
			}
			// Live after it: a held document leaves, a new one enters.
			e.store("orders.5", row("delete", 5, ""))
			again.expect(map[string]any{"type": "leave", "subject": "orders.5"})
			again.quiet()

			// A cursor ahead of the stream is a bad cursor.
			again.send(`{"type":"subscribe","id":"w","subject":"orders.*","where":"true","from":"` + aheadCursor(kind) + `"}`)
			again.expect(map[string]any{"type": "error", "id": "w", "code": "bad_cursor"})
		})
	}
}

func aheadCursor(kind string) string {
	if kind == "redis" {
		return "rs:99999999999999-0"
	}
	return "js:999999999"
}

func mapsEqualJSON(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, x := range a {
		y, ok := b[k]
		if !ok {
			return false
		}
		var xv, yv any
		if json.Unmarshal([]byte(x), &xv) != nil || json.Unmarshal([]byte(y), &yv) != nil || !jsonEqual(xv, yv) {
			return false
		}
	}
	return true
}

// TestLatestWhileEventsFlow: a snapshot taken while events keep coming
// ends, after its synced and the live events that follow, in the final
// state of every document, each frame of a subject newer than the last
// (no duplicate, nothing out of order).
func TestLatestWhileEventsFlow(t *testing.T) {
	for _, kind := range []string{"jetstream", "redis"} {
		t.Run(kind, func(t *testing.T) {
			e := newEnvOn(t, kind, func(c *gateway.Config) { c.Subjects = []string{"orders.>", "app.>"} })
			const subjects, rounds = 40, 30
			final := map[string]string{}
			var mu sync.Mutex
			publish := func(r int) {
				for s := range subjects {
					d := doc([]string{"open", "closed"}[(r+s)%2], r*1000+s)
					subj := fmt.Sprintf("orders.%d", s)
					e.store(subj, row("update", s, d))
					mu.Lock()
					final[subj] = d
					mu.Unlock()
				}
			}
			for r := range rounds / 2 {
				publish(r)
			}
			cl := e.dial()
			cl.keepSynced = true
			var wg sync.WaitGroup
			wg.Go(func() {
				for r := rounds / 2; r < rounds; r++ {
					publish(r)
				}
			})
			cl.send(`{"type":"subscribe","id":"v","subject":"orders.*","where":"doc.status == 'open'","from":"latest"}`)
			cl.expect(map[string]any{"type": "subscribed", "id": "v"})
			v := newViewState()
			seen := map[string]string{}
			check := func(m map[string]any) {
				s, _ := m["subject"].(string)
				c, _ := m["cursor"].(string)
				if prev, ok := seen[s]; ok && !cursorLess(kind, prev, c) {
					t.Fatalf("%s: a frame at %s after one at %s", s, c, prev)
				}
				seen[s] = c
			}
			for {
				m := cl.next()
				if m["type"] != "synced" {
					check(m)
				}
				v.apply(t, m)
				if m["type"] == "synced" {
					break
				}
			}
			wg.Wait()
			e.store("orders.end", row("insert", 0, doc("open", 0)))
			final["orders.end"] = doc("open", 0)
			for {
				m := cl.next()
				check(m)
				v.apply(t, m)
				if m["subject"] == "orders.end" {
					break
				}
			}
			want := map[string]string{}
			for s, d := range final {
				if contains(d, `"open"`) {
					want[s] = d
				}
			}
			if !mapsEqualJSON(v.docs, want) {
				t.Fatalf("view %v\nwant %v", v.docs, want)
			}
		})
	}
}

func cursorLess(kind, a, b string) bool {
	var x, y uint64
	if kind == "redis" {
		var xs, ys uint64
		fmt.Sscanf(a, "rs:%d-%d", &x, &xs)
		fmt.Sscanf(b, "rs:%d-%d", &y, &ys)
		return x < y || x == y && xs < ys
	}
	fmt.Sscanf(a, "js:%d", &x)
	fmt.Sscanf(b, "js:%d", &y)
	return x < y
}

// TestSnapshotBound: a snapshot past --max-snapshot documents ends with
// view_too_large naming the flag; so does a live view that comes to hold
// more; the connection and its other subscriptions go on.
func TestSnapshotBound(t *testing.T) {
	e := newEnvOn(t, "jetstream", func(c *gateway.Config) { c.Subjects = []string{"orders.>", "app.>"}; c.MaxSnapshot = 3 })
	for i := range 5 {
		e.store(fmt.Sprintf("orders.%d", i), row("insert", i, doc("open", i)))
	}
	cl := e.dial()
	cl.subscribe("other", "app.>")
	cl.send(`{"type":"subscribe","id":"big","subject":"orders.*","from":"latest"}`)
	cl.expect(map[string]any{"type": "subscribed", "id": "big"})
	for {
		m := cl.next()
		if m["type"] == "error" {
			if m["code"] != "view_too_large" || !contains(m["message"].(string), "--max-snapshot") {
				t.Fatalf("error %v, want view_too_large naming --max-snapshot", m)
			}
			break
		}
		if m["type"] != "event" {
			t.Fatalf("unexpected %v", m)
		}
	}
	cl.send(`{"type":"subscribe","id":"live","subject":"orders.*","where":"doc.status == 'open'"}`)
	cl.expect(map[string]any{"type": "subscribed", "id": "live"})
	for i := 10; i < 13; i++ {
		e.store(fmt.Sprintf("orders.%d", i), row("insert", i, doc("open", i)))
		cl.expect(map[string]any{"type": "event", "subs": []any{"live"}})
	}
	e.store("orders.13", row("insert", 13, doc("open", 13)))
	m := cl.expect(map[string]any{"type": "error", "id": "live", "code": "view_too_large"})
	if !contains(m["message"].(string), "--max-snapshot") {
		t.Fatalf("message %v", m)
	}
	e.store("app.1", `{}`)
	cl.expect(map[string]any{"type": "event", "subject": "app.1", "subs": []any{"other"}})
	cl.quiet()
	if got := e.metric("fanwire_subscriptions", nil); got != 1 {
		t.Fatalf("fanwire_subscriptions = %v, want 1", got)
	}
}

// TestGraphQLLatest: events(from: "latest", where:) on GraphQL: the
// snapshot's documents as EVENTs, then SYNCED with the cursor, for an
// operation that selects kind; one that does not is sent no SYNCED.
func TestGraphQLLatest(t *testing.T) {
	e := newEnvOn(t, "jetstream", func(c *gateway.Config) { c.Subjects = []string{"orders.>", "app.>"} })
	e.store("orders.1", row("insert", 1, doc("open", 1)))
	e.store("orders.2", row("insert", 2, doc("closed", 2)))
	last := e.store("orders.1", row("update", 1, doc("open", 3)))
	cl := e.initGQL()
	cl.send(`{"id":"a","type":"subscribe","payload":{"query":"subscription { events(subject: \"orders.*\", from: \"latest\", where: \"doc.status == 'open'\") { kind subject cursor data } }"}}`)
	for _, want := range []string{
		`{"id":"a","type":"next","payload":{"data":{"events":{"kind":"EVENT","subject":"orders.1","cursor":"` + last + `","data":{"op":"update","key":1,"doc":{"status":"open","total":3}}}}}}`,
		`{"id":"a","type":"next","payload":{"data":{"events":{"kind":"SYNCED","subject":"orders.*","cursor":"` + last + `","data":null}}}}`,
	} {
		if got := cl.nextRaw(); got != want {
			t.Fatalf("got  %s\nwant %s", got, want)
		}
	}
	cl.send(`{"id":"b","type":"subscribe","payload":{"query":"subscription { events(subject: \"orders.*\", from: \"latest\") { subject data } }"}}`)
	for _, s := range []string{"orders.2", "orders.1"} {
		m := cl.next()
		if m["id"] != "b" || !contains(fmt.Sprint(m["payload"]), s) {
			t.Fatalf("got %v, want %s", m, s)
		}
	}
	cl.gqlQuiet()
}
