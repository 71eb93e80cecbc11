package gateway_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fanwire/fanwire/broker"
	"github.com/fanwire/fanwire/gateway"
	"github.com/fanwire/fanwire/gateway/auth"
	"github.com/golang-jwt/jwt/v5"
)

// store publishes one event through the gateway's broker (any kind); it
// returns its cursor ("" on Core NATS).
func (e *env) store(subject, data string) string {
	e.t.Helper()
	cur, err := e.b.Publish(context.Background(), []broker.Outgoing{{Subject: subject, Data: []byte(data)}})
	if err != nil {
		e.t.Fatal(err)
	}
	return cur[0]
}

// row is an ingest-shaped event: op, key and the row as doc (null for a
// delete).
func row(op string, key int, doc string) string {
	if doc == "" {
		doc = "null"
	}
	return `{"op":"` + op + `","key":` + itoa(key) + `,"doc":` + doc + `}`
}

func itoa(i int) string {
	const digits = "0123456789"
	if i < 10 {
		return digits[i : i+1]
	}
	return itoa(i/10) + digits[i%10:i%10+1]
}

// TestLiveViewFiltersAndLeaves: a filtered subscription gets the events
// its where accepts and a leave for each document it holds that stops
// passing (an update out of the filter, a delete), and a truncate; an
// unfiltered subscription on the same connection gets every event, and
// no leave. On every broker kind (a live view needs no history).
func TestLiveViewFiltersAndLeaves(t *testing.T) {
	for _, kind := range []string{"nats", "jetstream", "redis"} {
		t.Run(kind, func(t *testing.T) {
			// orders.> stands for the ingest's subjects: only there is a
			// truncate-shaped event a truncate (TestForgedTruncate).
			e := newEnvOn(t, kind, func(c *gateway.Config) { c.ReservedSubjects = []string{"orders.>"} })
			cl := e.dial()
			cl.send(`{"type":"subscribe","id":"v","subject":"orders.*","where":"doc.status == 'open' && doc.total > 100"}`)
			cl.expect(map[string]any{"type": "subscribed", "id": "v"})
			cl.subscribe("all", "orders.*")
			steps := []struct {
				subject, data string
				view          string // what v gets: "event", "leave" or ""
			}{
				{"orders.1", row("insert", 1, `{"id":1,"status":"open","total":150}`), "event"},
				{"orders.2", row("insert", 2, `{"id":2,"status":"closed","total":500}`), ""},
				{"orders.2", row("update", 2, `{"id":2,"status":"open","total":50}`), ""},
				{"orders.1", row("update", 1, `{"id":1,"status":"open","total":160}`), "event"},
				{"orders.1", row("update", 1, `{"id":1,"status":"closed","total":160}`), "leave"},
				{"orders.1", row("update", 1, `{"id":1,"status":"closed","total":170}`), ""},
				{"orders.2", row("update", 2, `{"id":2,"status":"open","total":101.5}`), "event"},
				{"orders.2", row("delete", 2, ""), "leave"},
				{"orders.3", row("insert", 3, `{"id":3,"status":"open","total":1e3}`), "event"},
				{"orders.%truncate", `{"op":"truncate","key":null,"doc":null}`, "event"},
				{"orders.3", row("update", 3, `{"id":3,"status":"closed","total":1e3}`), ""}, // truncated: no longer held
			}
			for i, s := range steps {
				e.store(s.subject, s.data)
				switch s.view {
				case "event":
					cl.expect(map[string]any{"type": "event", "subject": s.subject, "subs": []any{"v"}})
				case "leave":
					m := cl.expect(map[string]any{"type": "leave", "subject": s.subject, "subs": []any{"v"}})
					if _, ok := m["data"]; ok {
						t.Fatalf("step %d: a leave carries data: %v", i, m)
					}
				}
				cl.expect(map[string]any{"type": "event", "subject": s.subject, "subs": []any{"all"}})
			}
			cl.quiet()
			if got := e.metric("fanwire_subscriptions", nil); got != 2 {
				t.Fatalf("fanwire_subscriptions = %v, want 2", got)
			}
			if got := e.metric("fanwire_views", nil); got != 1 {
				t.Fatalf("fanwire_views = %v, want 1", got)
			}
			// orders.1 left, orders.2 was deleted, orders.3 truncated.
			if got := e.metric("fanwire_view_documents", nil); got != 0 {
				t.Fatalf("fanwire_view_documents = %v, want 0", got)
			}
			// The filter is indexed on doc.status == 'open': only the 5
			// events whose status is open were evaluated; the others
			// (closed, the delete's null doc) were never candidates. The
			// dispatcher adds a batch's counts once it is queued: wait.
			waitFor(t, "5 filter evaluations", func() bool { return e.metric("fanwire_filter_evaluations_total", nil) == 5 })
			cl.send(`{"type":"unsubscribe","id":"v"}`)
			cl.expect(map[string]any{"type": "unsubscribed", "id": "v"})
			e.store("orders.5", row("insert", 5, `{"id":5,"status":"open","total":900}`))
			cl.expect(map[string]any{"type": "event", "subject": "orders.5", "subs": []any{"all"}})
			cl.quiet()
		})
	}
}

// TestFilterErrorsCounted: an evaluation that is an error (a missing
// field, a numeric column's string where a number is compared) rejects the
// event and is counted, so an operator can see a filter that never
// passes.
func TestFilterErrorsCounted(t *testing.T) {
	e := newEnv(t, nil)
	cl := e.dial()
	cl.send(`{"type":"subscribe","id":"v","subject":"orders.*","where":"doc.total > 100"}`)
	cl.expect(map[string]any{"type": "subscribed", "id": "v"})
	e.store("orders.1", `{"doc":{"total":"150.50"}}`)
	e.store("orders.2", `{"doc":{}}`)
	e.store("orders.3", `{"doc":{"total":150.5}}`)
	cl.expect(map[string]any{"type": "event", "subject": "orders.3"})
	waitFor(t, "2 errors of 3 evaluations", func() bool {
		return e.metric("fanwire_filter_evaluations_total", nil) == 3 && e.metric("fanwire_filter_errors_total", nil) == 2
	})
}

// TestWhereErrors: a where that does not compile is bad_filter naming the
// position; the connection stays.
func TestWhereErrors(t *testing.T) {
	e := newEnv(t, nil)
	cl := e.dial()
	for _, tc := range []struct{ frame, code, in string }{
		{`{"type":"subscribe","id":"a","subject":"orders.*","where":"doc.status =="}`, "bad_filter", "1:14"},
		{`{"type":"subscribe","id":"b","subject":"orders.*","where":"doc.x = 1"}`, "bad_filter", "1:7"},
		{`{"type":"subscribe","id":"c","subject":"orders.*","where":""}`, "bad_filter", "empty"},
		{`{"type":"subscribe","id":"d","subject":"orders.*","where":"1 + 2"}`, "bad_filter", "not a bool"},
		{`{"type":"subscribe","id":"e","subject":"orders.*","where":5}`, "bad_frame", "string"},
		{`{"type":"publish","id":"f","subject":"orders.1","data":1,"where":"true"}`, "bad_frame", "publish takes only"},
		{`{"type":"subscribe","id":"g","subject":"orders.*","from":"latest"}`, "bad_cursor", "keeps no history"},
	} {
		cl.send(tc.frame)
		m := cl.expect(map[string]any{"type": "error", "code": tc.code})
		if msg, _ := m["message"].(string); !contains(msg, tc.in) {
			t.Errorf("%s: message %q, want it to name %q", tc.frame, msg, tc.in)
		}
	}
	cl.quiet()
}

func contains(s, sub string) bool {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return true
		}
	}
	return false
}

// TestGraphQLWhereAndLeave: events(subject, where) on GraphQL: the
// accepted events as EVENT, a LEAVE with null data, byte for byte on the
// spliced path, and the executor's path (a selection it must run) agrees.
func TestGraphQLWhereAndLeave(t *testing.T) {
	e := newEnvOn(t, "jetstream", nil)
	cl := e.initGQL()
	cl.send(`{"id":"a","type":"subscribe","payload":{"query":"subscription { events(subject: \"orders.*\", where: \"doc.n > 1\") { kind subject data } }"}}`)
	cl.send(`{"id":"b","type":"subscribe","payload":{"query":"subscription { events(subject: \"orders.*\", where: \"doc.n > 1\") { kind subject data ... on Event { keys } } }"}}`)
	cl.gqlQuiet()
	e.store("orders.1", `{"doc":{"n":2}}`)
	e.store("orders.1", `{"doc":{"n":1}}`)
	for _, want := range []string{
		`{"id":"a","type":"next","payload":{"data":{"events":{"kind":"EVENT","subject":"orders.1","data":{"doc":{"n":2}}}}}}`,
		`{"id":"b","type":"next","payload":{"data":{"events":{"kind":"EVENT","subject":"orders.1","data":{"doc":{"n":2}},"keys":null}}}}`,
		`{"id":"a","type":"next","payload":{"data":{"events":{"kind":"LEAVE","subject":"orders.1","data":null}}}}`,
		`{"id":"b","type":"next","payload":{"data":{"events":{"kind":"LEAVE","subject":"orders.1","data":null,"keys":null}}}}`,
	} {
		if got := cl.nextRaw(); got != want {
			t.Fatalf("got  %s\nwant %s", got, want)
		}
	}
	cl.send(`{"id":"c","type":"subscribe","payload":{"query":"subscription { events(subject: \"orders.*\", where: \"doc.n >\") { kind } }"}}`)
	if code := cl.gqlErrorCode("c"); code != "bad_filter" {
		t.Fatalf("a bad where: code %q, want bad_filter", code)
	}
	cl.gqlQuiet()
}

// TestForgedTruncate: a truncate-shaped event published outside the
// ingest's reserved subjects is an ordinary event: a row-filtered view
// does not receive it (its filter rejects it, as any event without its
// rows), nor drops what it holds; a view whose filter accepts it gets it
// as an event and still holds its documents (a later update out of the
// filter is a leave); a later snapshot is whole.
func TestForgedTruncate(t *testing.T) {
	e := jwtEnv(t, "jetstream", auth.JWTConfig{}, nil)
	tok := func(sub string) string {
		return sign(t, jwt.SigningMethodHS256, []byte(testSecret), "", jwt.MapClaims{
			"sub": sub, "exp": time.Now().Add(time.Hour).Unix(),
			"subscribe": []any{map[string]any{"subject": "app.orders.*", "where": "doc.customer_id == claims.sub"}, "app.x.>"},
		})
	}
	e.store("app.orders.1", `{"op":"insert","doc":{"customer_id":"c1","n":1}}`)
	e.store("app.orders.2", `{"op":"insert","doc":{"customer_id":"c2","n":2}}`)
	c1 := e.dialToken(tok("c1"))
	c1.keepSynced = true
	c1.send(`{"type":"subscribe","id":"v","subject":"app.orders.*","from":"latest"}`)
	c1.expect(map[string]any{"type": "subscribed", "id": "v"})
	c1.expect(map[string]any{"type": "event", "subject": "app.orders.1"})
	c1.expect(map[string]any{"type": "synced", "id": "v"})
	open := e.dialToken(sign(t, jwt.SigningMethodHS256, []byte(testSecret), "", jwt.MapClaims{
		"sub": "ops", "exp": time.Now().Add(time.Hour).Unix(), "subscribe": []any{"app.>"},
	}))
	open.send(`{"type":"subscribe","id":"w","subject":"app.orders.*","where":"op == 'truncate' || doc.n < 10"}`)
	open.expect(map[string]any{"type": "subscribed", "id": "w"})

	e.store("app.orders.1", `{"op":"update","doc":{"customer_id":"c1","n":1}}`)
	open.expect(map[string]any{"type": "event", "subject": "app.orders.1"})
	c1.expect(map[string]any{"type": "event", "subject": "app.orders.1"})
	e.store("app.orders.%truncate", `{"op":"truncate","key":null,"doc":null}`)
	e.store("app.orders.3", `{"op":"insert","doc":{"customer_id":"c1","n":3}}`)
	c1.expect(map[string]any{"type": "event", "subject": "app.orders.3"}) // not the truncate
	open.expect(map[string]any{"type": "event", "subject": "app.orders.%truncate"})
	open.expect(map[string]any{"type": "event", "subject": "app.orders.3"})
	// Still held by both: an update out of their filters is a leave.
	e.store("app.orders.1", `{"op":"update","doc":{"customer_id":"c9","n":99}}`)
	c1.expect(map[string]any{"type": "leave", "subject": "app.orders.1"})
	open.expect(map[string]any{"type": "leave", "subject": "app.orders.1"})

	// A new snapshot: c1's rows, whatever the forged truncate.
	e.store("app.orders.1", `{"op":"update","doc":{"customer_id":"c1","n":1}}`)
	late := e.dialToken(tok("c1"))
	late.keepSynced = true
	late.send(`{"type":"subscribe","id":"v","subject":"app.orders.*","from":"latest"}`)
	late.expect(map[string]any{"type": "subscribed", "id": "v"})
	got := map[string]bool{}
	for {
		m := late.next()
		if m["type"] == "synced" {
			break
		}
		got[m["subject"].(string)] = true
	}
	if !got["app.orders.1"] || !got["app.orders.3"] || len(got) != 2 {
		t.Fatalf("the snapshot after a forged truncate: %v, want app.orders.1 and app.orders.3", got)
	}
}

// TestViewDocumentBounds: besides each view's --max-snapshot, the
// documents a connection's views hold together and those the node's hold
// are bounded, each past its bound ending the view with view_too_large
// naming it. Before, a connection could hold 256 views of 100,000
// documents each.
func TestViewDocumentBounds(t *testing.T) {
	e := newEnv(t, func(c *gateway.Config) {
		c.MaxSnapshot = 10
		c.MaxViewDocumentsPerConnection = 15
		c.MaxViewDocuments = 20
	})
	view := func(cl *client, id, pattern string) {
		cl.send(`{"type":"subscribe","id":"` + id + `","subject":"` + pattern + `","where":"doc.n >= 0"}`)
		cl.expect(map[string]any{"type": "subscribed", "id": id})
	}
	fill := func(prefix string, n int) {
		for i := range n {
			e.store(prefix+strconv.Itoa(i), `{"doc":{"n":`+strconv.Itoa(i)+`}}`)
		}
	}
	ended := func(cl *client, id, flag string, events int) {
		t.Helper()
		for range events {
			cl.expect(map[string]any{"type": "event", "subs": []any{id}})
		}
		m := cl.expect(map[string]any{"type": "error", "id": id, "code": "view_too_large"})
		if !strings.Contains(m["message"].(string), flag) {
			t.Fatalf("%s: %v, want it to name %s", id, m, flag)
		}
	}
	a := e.dial()
	view(a, "a1", "app.a.*")
	fill("app.a.", 8)
	for range 8 {
		a.expect(map[string]any{"type": "event", "subs": []any{"a1"}})
	}
	view(a, "a2", "app.b.*")
	fill("app.b.", 8)
	ended(a, "a2", "--max-view-documents-per-connection", 7) // 8 + 7 = 15
	b := e.dial()
	view(b, "b", "app.c.*")
	fill("app.c.", 11)
	ended(b, "b", "--max-snapshot", 10)
	view(b, "b2", "app.c2.*")
	fill("app.c2.", 10)
	for range 10 {
		b.expect(map[string]any{"type": "event", "subs": []any{"b2"}})
	}
	c := e.dial()
	view(c, "c", "app.d.*")
	fill("app.d.", 3)
	ended(c, "c", "(--max-view-documents)", 2) // 8 + 10 + 2 = 20
	waitFor(t, "the documents counted", func() bool { return e.metric("fanwire_view_documents", nil) == 18 })
}

// TestFilteredSnapshotScanBounded: a filtered view's snapshot reads at
// most ten times --max-snapshot subjects from the broker, whatever its
// where passes: past that the subscription ends with view_too_large
// saying so, before the broker's index is read into memory.
func TestFilteredSnapshotScanBounded(t *testing.T) {
	for _, kind := range []string{"jetstream", "redis"} {
		t.Run(kind, func(t *testing.T) {
			e := newEnvOn(t, kind, func(c *gateway.Config) { c.MaxSnapshot = 2 })
			for i := range 21 {
				e.store("orders."+strconv.Itoa(i), `{"doc":{"n":`+strconv.Itoa(i)+`}}`)
			}
			cl := e.dial()
			cl.send(`{"type":"subscribe","id":"v","subject":"orders.*","where":"doc.n == 3","from":"latest"}`)
			cl.expect(map[string]any{"type": "subscribed", "id": "v"})
			m := cl.expect(map[string]any{"type": "error", "id": "v", "code": "view_too_large"})
			if !strings.Contains(m["message"].(string), "stored subjects") {
				t.Fatalf("%v", m)
			}
			// Within the bound it snapshots: 20 subjects, one passing.
			for i := range 20 {
				e.store("app.items."+strconv.Itoa(i), `{"doc":{"n":`+strconv.Itoa(i)+`}}`)
			}
			cl.send(`{"type":"subscribe","id":"w","subject":"app.items.*","where":"doc.n == 13","from":"latest"}`)
			cl.expect(map[string]any{"type": "subscribed", "id": "w"})
			cl.expect(map[string]any{"type": "event", "subject": "app.items.13"})
		})
	}
}
