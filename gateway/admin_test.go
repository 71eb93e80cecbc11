package gateway_test

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/fanwire/fanwire/gateway"
	"github.com/fanwire/fanwire/gateway/auth"
	"github.com/golang-jwt/jwt/v5"
)

const testAdminKey = "admin-key-for-tests-0123456789abcdef" // 36 characters: over gateway.MinAdminKeyLen

// adminConn is a listed connection, as the inspector answers it.
type adminConn struct {
	ID              string  `json:"id"`
	Remote          string  `json:"remote"`
	Protocol        string  `json:"protocol"`
	Sub             string  `json:"sub"`
	AgeSeconds      float64 `json:"age_seconds"`
	MailboxItems    int     `json:"mailbox_items"`
	MessagesWritten uint64  `json:"messages_written"`
	BytesSent       uint64  `json:"bytes_sent"`
	Subscriptions   []struct {
		ID, Pattern, Kind string
		Live, Presence    bool
	} `json:"subscriptions"`
	Tracking []string `json:"tracking"`
}

type adminList struct {
	Node        int         `json:"node_connections"`
	Connections []adminConn `json:"connections"`
	Next        string      `json:"next"`
}

// adminDo sends an admin request with key ("" none) and decodes the JSON
// answer into out (nil: not decoded); it returns the status.
func (e *env) adminDo(method, path, key, body string, out any) int {
	e.t.Helper()
	req, err := http.NewRequest(method, e.http.URL+path, strings.NewReader(body))
	if err != nil {
		e.t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		e.t.Fatalf("%s %s: Content-Type %q, want application/json", method, path, ct)
	}
	var v map[string]any
	if out == nil {
		out = &v
	}
	if err := jsonDecode(resp.Body, out); err != nil {
		e.t.Fatalf("%s %s: %v", method, path, err)
	}
	return resp.StatusCode
}

func (e *env) adminList(query string) adminList {
	e.t.Helper()
	var l adminList
	if st := e.adminDo("GET", "/admin/connections"+query, testAdminKey, "", &l); st != http.StatusOK {
		e.t.Fatalf("GET /admin/connections%s: %d", query, st)
	}
	return l
}

// dialAs opens a native connection with token and keeps its id.
func (e *env) dialAs(token string) *client {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, _, err := websocket.Dial(ctx, e.wsURL()+"?token="+url.QueryEscape(token), nil)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { _ = c.CloseNow() })
	cl := &client{t: e.t, c: c}
	ready := cl.expect(map[string]any{"type": "ready"})
	cl.id, _ = ready["connection_id"].(string)
	return cl
}

func adminTokenFor(t *testing.T, sub string) string {
	return sign(t, jwt.SigningMethodHS256, []byte(testSecret), "", jwt.MapClaims{"sub": sub, "exp": time.Now().Add(time.Hour).Unix(), "subscribe": []any{">"}})
}

// TestAdminNotServed: without an admin key nothing under /admin/ is
// served, whatever the credential.
func TestAdminNotServed(t *testing.T) {
	e := newEnv(t, nil) // the console is on: its file server must not answer either
	for _, r := range []struct{ method, path string }{{"GET", "/admin/connections"}, {"POST", "/admin/connections/close"}, {"GET", "/admin/"}} {
		var body map[string]any
		if st := e.adminDo(r.method, r.path, testAdminKey, `{"sub":"x","code":4000}`, &body); st != http.StatusNotFound || body["code"] != gateway.CodeNotFound {
			t.Fatalf("%s %s without --admin-key: %d %v, want 404 not_found", r.method, r.path, st, body)
		}
	}
}

// TestAdminKeyTooShort: a key under MinAdminKeyLen characters is refused
// by New, without the key in the error.
func TestAdminKeyTooShort(t *testing.T) {
	e := newEnv(t, nil)
	for key, want := range map[string]string{
		"too-short-admin-key":   "AdminKey has 19 characters, want at least 32",
		strings.Repeat("é", 31): "AdminKey has 31 characters", // characters, not bytes
	} {
		_, err := gateway.New(gateway.Config{Broker: e.b, AdminKey: key})
		if err == nil || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), key) {
			t.Errorf("a key of %d characters: %v, want %q without the key", len([]rune(key)), err, want)
		}
	}
	if _, err := gateway.New(gateway.Config{Broker: e.b, AdminKey: strings.Repeat("k", gateway.MinAdminKeyLen)}); err != nil {
		t.Fatalf("a key of MinAdminKeyLen characters: %v", err)
	}
}

// TestAdminAPI: the inspector over HTTP against real connections with
// tokens of different subs: refused without the key, lists, filters and
// pages, and closes one connection and all of a sub's with the codes the
// clients then see.
func TestAdminAPI(t *testing.T) {
	a, err := auth.NewJWTAuth(auth.JWTConfig{SecretFile: writeFile(t, "secret", testSecret)})
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, func(c *gateway.Config) { c.Authenticate = a.Grant; c.AdminKey = testAdminKey })

	t.Run("refused", func(t *testing.T) {
		for _, key := range []string{"", "wrong", testAdminKey + "x"} {
			for _, r := range []struct{ method, path string }{{"GET", "/admin/connections"}, {"POST", "/admin/connections/close"}} {
				var body map[string]any
				if st := e.adminDo(r.method, r.path, key, `{"sub":"alice","code":4000}`, &body); st != http.StatusUnauthorized || body["code"] != gateway.CodeUnauthorized {
					t.Fatalf("%s %s with key %q: %d %v, want 401 unauthorized", r.method, r.path, key, st, body)
				}
			}
		}
		if got := e.metric("fanwire_admin_refused_total", nil); got != 6 {
			t.Fatalf("fanwire_admin_refused_total = %v, want 6", got)
		}
	})

	alice1 := e.dialAs(adminTokenFor(t, "alice"))
	alice1.subscribe("o", "orders.*")
	alice2 := e.dialAs(adminTokenFor(t, "alice"))
	alice2.subscribe("a", "app.>")
	bob := e.dialAs(adminTokenFor(t, "bob"))
	bob.subscribe("o1", "orders.1")
	gql := e.dialGQL()
	gql.send(`{"type":"connection_init","payload":{"token":"` + adminTokenFor(t, "carol") + `"}}`)
	if raw := gql.nextRaw(); raw != `{"type":"connection_ack"}` {
		t.Fatalf("got %s", raw)
	}
	e.publish("orders.1", `{"n":1}`)
	alice1.expect(map[string]any{"type": "event", "subject": "orders.1"})
	bob.expect(map[string]any{"type": "event", "subject": "orders.1"})

	t.Run("list", func(t *testing.T) {
		l := e.adminList("")
		if l.Node != 4 || len(l.Connections) != 4 || l.Next != "" {
			t.Fatalf("list: %+v, want the 4 connections on one page", l)
		}
		byID := map[string]adminConn{}
		for _, c := range l.Connections {
			byID[c.ID] = c
			if c.Remote != "127.0.0.1" || c.AgeSeconds < 0 {
				t.Fatalf("connection %+v: want remote 127.0.0.1 and an age", c)
			}
		}
		a1, ok := byID[alice1.id]
		if !ok || a1.Sub != "alice" || a1.Protocol != "native" || len(a1.Subscriptions) != 1 ||
			a1.Subscriptions[0].ID != "o" || a1.Subscriptions[0].Pattern != "orders.*" || a1.Subscriptions[0].Kind != "live" || !a1.Subscriptions[0].Live {
			t.Fatalf("alice's first connection lists as %+v", a1)
		}
		// ready, subscribed, the event: written, and their bytes counted.
		if a1.MessagesWritten < 3 || a1.BytesSent == 0 || a1.MailboxItems != 0 {
			t.Fatalf("alice's first connection: %d messages, %d bytes, mailbox %d; want ≥ 3, > 0, 0", a1.MessagesWritten, a1.BytesSent, a1.MailboxItems)
		}
		protocols := map[string]string{}
		for _, c := range l.Connections {
			protocols[c.Sub] = c.Protocol
		}
		if protocols["carol"] != "graphql" || protocols["bob"] != "native" {
			t.Fatalf("protocols by sub: %v", protocols)
		}
	})

	t.Run("filter", func(t *testing.T) {
		ids := func(l adminList) map[string]bool {
			m := map[string]bool{}
			for _, c := range l.Connections {
				m[c.ID] = true
			}
			return m
		}
		if got := ids(e.adminList("?sub=alice")); len(got) != 2 || !got[alice1.id] || !got[alice2.id] {
			t.Fatalf("sub=alice: %v", got)
		}
		// A subject: every subscription that matches it.
		if got := ids(e.adminList("?subject=orders.1")); len(got) != 2 || !got[alice1.id] || !got[bob.id] {
			t.Fatalf("subject=orders.1: %v", got)
		}
		// A pattern: the subscriptions of that very pattern.
		if got := ids(e.adminList("?subject=" + url.QueryEscape("app.>"))); len(got) != 1 || !got[alice2.id] {
			t.Fatalf("subject=app.>: %v", got)
		}
		if got := ids(e.adminList("?sub=alice&subject=orders.1")); len(got) != 1 || !got[alice1.id] {
			t.Fatalf("sub=alice&subject=orders.1: %v", got)
		}
		if got := ids(e.adminList("?sub=nobody")); len(got) != 0 {
			t.Fatalf("sub=nobody: %v", got)
		}
		for _, q := range []string{"?limit=0", "?limit=1001", "?limit=x", "?subject=orders..x"} {
			if st := e.adminDo("GET", "/admin/connections"+q, testAdminKey, "", nil); st != http.StatusBadRequest {
				t.Fatalf("%s: %d, want 400", q, st)
			}
		}
	})

	t.Run("pages", func(t *testing.T) {
		seen := map[string]bool{}
		pages, after := 0, ""
		for {
			l := e.adminList("?limit=3&after=" + after)
			pages++
			for _, c := range l.Connections {
				if seen[c.ID] || c.ID <= after {
					t.Fatalf("page %d repeats or goes back: %s after %q", pages, c.ID, after)
				}
				seen[c.ID] = true
			}
			if l.Next == "" {
				break
			}
			if len(l.Connections) != 3 {
				t.Fatalf("page %d: %d connections and a next", pages, len(l.Connections))
			}
			after = l.Next
		}
		if pages != 2 || len(seen) != 4 {
			t.Fatalf("%d pages, %d connections; want 2 and 4", pages, len(seen))
		}
	})

	t.Run("close", func(t *testing.T) {
		for _, body := range []string{
			`{"id":"` + bob.id + `","code":3000}`,
			`{"id":"` + bob.id + `","code":1006}`,
			`{"code":4000}`,
			`{"id":"` + bob.id + `","sub":"bob","code":4000}`,
			`{"id":"` + bob.id + `","code":4000,"reason":"` + strings.Repeat("x", 124) + `"}`,
			`{"id":"` + bob.id + `","code":4000,"extra":1}`,
			`not json`,
		} {
			if st := e.adminDo("POST", "/admin/connections/close", testAdminKey, body, nil); st != http.StatusBadRequest {
				t.Fatalf("close %s: %d, want 400", body, st)
			}
		}
		var nf map[string]any
		if st := e.adminDo("POST", "/admin/connections/close", testAdminKey, `{"id":"0000","code":4000}`, &nf); st != http.StatusNotFound || nf["code"] != gateway.CodeNotFound {
			t.Fatalf("close of an unknown id: %d %v", st, nf)
		}

		var res struct{ Closed int }
		if st := e.adminDo("POST", "/admin/connections/close", testAdminKey, `{"id":"`+bob.id+`","code":4000,"reason":"bye bob"}`, &res); st != http.StatusOK || res.Closed != 1 {
			t.Fatalf("close bob: %d %+v", st, res)
		}
		if got := bob.closeStatus(5 * time.Second); got != 4000 {
			t.Fatalf("bob's connection closed with %d, want 4000", got)
		}
		if st := e.adminDo("POST", "/admin/connections/close", testAdminKey, `{"sub":"alice","code":4003}`, &res); st != http.StatusOK || res.Closed != 2 {
			t.Fatalf("close alice: %d %+v", st, res)
		}
		for _, cl := range []*client{alice1, alice2} {
			if got := cl.closeStatus(5 * time.Second); got != 4003 {
				t.Fatalf("alice's connection closed with %d, want 4003", got)
			}
		}
		waitFor(t, "only carol's connection left", func() bool {
			l := e.adminList("")
			return len(l.Connections) == 1 && l.Connections[0].Sub == "carol"
		})
		if got := e.metric("fanwire_disconnects_total", map[string]string{"reason": "admin"}); got != 3 {
			t.Fatalf("fanwire_disconnects_total{reason=admin} = %v, want 3", got)
		}
		// A sub with no connection: nothing closed, not an error.
		if st := e.adminDo("POST", "/admin/connections/close", testAdminKey, `{"sub":"alice","code":4003}`, &res); st != http.StatusOK || res.Closed != 0 {
			t.Fatalf("close alice again: %d %+v", st, res)
		}
	})
}
