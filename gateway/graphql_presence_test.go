package gateway_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fanwire/fanwire/gateway"
	"github.com/golang-jwt/jwt/v5"
)

// GraphQL presence: track and untrack mutations, the members query and
// the presence subscription (graphql_presence.go), over graphql-transport-ws.

const presenceSub = `subscription($s: String!) { presence(subject: $s) { subject count joins { conn sub state } leaves { conn sub state } updates { conn sub state } } }`

// initGQLToken connects to /graphql and initialises with token (none: "").
func (e *env) initGQLToken(tok string) *client {
	e.t.Helper()
	cl := e.dialGQL()
	payload := `{}`
	if tok != "" {
		payload = `{"token":"` + tok + `"}`
	}
	cl.send(`{"type":"connection_init","payload":` + payload + `}`)
	if raw := cl.nextRaw(); raw != `{"type":"connection_ack"}` {
		e.t.Fatalf("got %s, want connection_ack", raw)
	}
	return cl
}

// gqlOp sends operation id with query and variables (nil: none).
func (cl *client) gqlOp(id, query string, vars map[string]any) {
	cl.t.Helper()
	p := map[string]any{"query": query}
	if vars != nil {
		p["variables"] = vars
	}
	b, err := json.Marshal(map[string]any{"id": id, "type": "subscribe", "payload": p})
	if err != nil {
		cl.t.Fatal(err)
	}
	cl.send(string(b))
}

// gqlResult runs a query or mutation and returns its one response's
// payload (raw), checking the complete that follows it.
func (cl *client) gqlResult(id, query string, vars map[string]any) string {
	cl.t.Helper()
	cl.gqlOp(id, query, vars)
	raw := cl.nextRaw()
	head := `{"id":"` + id + `","type":"next","payload":`
	if !strings.HasPrefix(raw, head) {
		cl.t.Fatalf("got %s, want a next for %s", raw, id)
	}
	if done := cl.nextRaw(); done != `{"id":"`+id+`","type":"complete"}` {
		cl.t.Fatalf("got %s, want complete for %s", done, id)
	}
	return strings.TrimSuffix(strings.TrimPrefix(raw, head), "}")
}

// gqlErrorCodes is the extensions.code of each error of a response
// payload, and its data.
func gqlErrorCodes(t *testing.T, payload string) (codes []string, data any) {
	t.Helper()
	var r struct {
		Data   any `json:"data"`
		Errors []struct {
			Message    string         `json:"message"`
			Extensions map[string]any `json:"extensions"`
		} `json:"errors"`
	}
	if err := json.Unmarshal([]byte(payload), &r); err != nil {
		t.Fatalf("%s: %v", payload, err)
	}
	for _, e := range r.Errors {
		if e.Message == "" {
			t.Fatalf("an error without a message: %s", payload)
		}
		c, _ := e.Extensions["code"].(string)
		codes = append(codes, c)
	}
	return codes, r.Data
}

// track runs a track mutation on cl with state (JSON text; "" for none)
// and checks it answered true.
func (cl *client) gqlTrack(id, subject, state string) {
	cl.t.Helper()
	vars := map[string]any{"s": subject}
	q := `mutation($s: String!) { track(subject: $s) { member resume } }`
	if state != "" {
		vars["st"] = json.RawMessage(state)
		q = `mutation($s: String!, $st: JSON) { track(subject: $s, state: $st) { member resume } }`
	}
	got := cl.gqlResult(id, q, vars)
	var r struct {
		Data struct {
			Track struct{ Member, Resume string }
		}
	}
	if err := json.Unmarshal([]byte(got), &r); err != nil || r.Data.Track.Member == "" || len(r.Data.Track.Resume) != 32 {
		cl.t.Fatalf("track %s: %s", subject, got)
	}
}

// presenceNext is the next message of presenceSub (alias presence) for
// one change; members are {"conn","sub","state"} JSON objects.
func presenceNext(id, subject string, count int, joins, leaves, updates []string) string {
	list := func(ms []string) string { return "[" + strings.Join(ms, ",") + "]" }
	return fmt.Sprintf(`{"id":%q,"type":"next","payload":{"data":{"presence":{"subject":%q,"count":%d,"joins":%s,"leaves":%s,"updates":%s}}}}`,
		id, subject, count, list(joins), list(leaves), list(updates))
}

func gqlMember(conn, sub, state string) string {
	if sub != "null" {
		sub = `"` + sub + `"`
	}
	return `{"conn":"` + conn + `","sub":` + sub + `,"state":` + state + `}`
}

// joinedConn reads a next message announcing one join on subject and
// returns the member's conn (a GraphQL client does not learn its own).
func (cl *client) joinedConn(id string) string {
	cl.t.Helper()
	raw := cl.nextRaw()
	var m struct {
		ID      string `json:"id"`
		Payload struct {
			Data struct {
				Presence struct {
					Joins []struct {
						Conn string `json:"conn"`
					} `json:"joins"`
				} `json:"presence"`
			} `json:"data"`
		} `json:"payload"`
	}
	if err := json.Unmarshal([]byte(raw), &m); err != nil || m.ID != id || len(m.Payload.Data.Presence.Joins) != 1 {
		cl.t.Fatalf("got %s, want a presence change with one join for %s", raw, id)
	}
	return m.Payload.Data.Presence.Joins[0].Conn
}

// TestGraphQLPresence: track, update, untrack and a closed connection
// reach a presence subscription as joins, updates and leaves with the
// count, byte for byte, on the splice path and through the executor
// alike; members pages through the members over WebSocket and HTTP;
// complete ends the watch.
func TestGraphQLPresence(t *testing.T) {
	for _, path := range []string{"splice", "executor"} {
		t.Run(path, func(t *testing.T) {
			e := newEnv(t, presenceCfg(func(c *gateway.Config) { c.PresenceRate = 1000 }))
			if path == "executor" {
				gateway.ForceGraphQLExecutor(e.srv)
			}
			w := e.initGQL()
			w.gqlOp("p", presenceSub, map[string]any{"s": "room.*"})
			// A second watch of the same subject, with aliases, __typename
			// and a selection of its own, on the same connection.
			w.gqlOp("q", `subscription { x: presence(subject: "room.1") { __typename n: count joins { __typename c: conn } leaves { conn } } }`, nil)
			w.gqlQuiet()
			// A watcher that goes away takes its watch along.
			w2 := e.initGQL()
			w2.gqlOp("p", presenceSub, map[string]any{"s": "room.>"})
			e.waitSubscriptions(3)
			_ = w2.c.CloseNow()
			e.waitSubscriptions(2)

			a, b := e.initGQL(), e.initGQL()
			a.gqlTrack("t1", "room.1", `{ "name" : "ann" }`)
			ka := w.joinedConn("p")
			if got, want := w.nextRaw(), `{"id":"q","type":"next","payload":{"data":{"x":{"__typename":"PresenceChange","n":1,"joins":[{"__typename":"Member","c":"`+ka+`"}],"leaves":[]}}}}`; got != want {
				t.Fatalf("got  %s\nwant %s", got, want)
			}
			b.gqlTrack("t2", "room.1", "")
			kb := w.joinedConn("p")
			w.nextRaw() // q's
			a.gqlTrack("t3", "room.1", `{"name":"ann","typing":true}`)
			if got, want := w.nextRaw(), presenceNext("p", "room.1", 2, nil, nil, []string{gqlMember(ka, "null", `{"name":"ann","typing":true}`)}); got != want {
				t.Fatalf("got  %s\nwant %s", got, want)
			}
			if got, want := w.nextRaw(), `{"id":"q","type":"next","payload":{"data":{"x":{"__typename":"PresenceChange","n":2,"joins":[],"leaves":[]}}}}`; got != want {
				t.Fatalf("got  %s\nwant %s", got, want)
			}
			a.gqlTrack("t4", "room.1", `{"name": "ann", "typing": true}`) // the same state: no change
			w.gqlQuiet()

			// members, a page at a time, over WebSocket.
			want := []string{ka, kb}
			slices.Sort(want)
			const membersQ = `query($s: String!, $after: String) { members(subject: $s, after: $after, limit: 1) { subject count members { conn sub state } next } }`
			page1 := w.gqlResult("m1", membersQ, map[string]any{"s": "room.1"})
			if page1 != `{"data":{"members":{"subject":"room.1","count":2,"members":[`+memberOf(want[0], ka)+`],"next":"`+want[0]+`"}}}` {
				t.Fatalf("page 1: %s", page1)
			}
			page2 := w.gqlResult("m2", membersQ, map[string]any{"s": "room.1", "after": want[0]})
			if page2 != `{"data":{"members":{"subject":"room.1","count":2,"members":[`+memberOf(want[1], ka)+`],"next":null}}}` {
				t.Fatalf("page 2: %s", page2)
			}
			// And over HTTP (no authentication: every subject).
			if got := postGraphQL(t, e, "", `{"query":"{ members(subject: \"room.1\") { count members { conn } } }"}`); got != `{"data":{"members":{"count":2,"members":[{"conn":"`+want[0]+`"},{"conn":"`+want[1]+`"}]}}}` {
				t.Fatalf("members over HTTP: %s", got)
			}

			if got := b.gqlResult("u1", `mutation { untrack(subject: "room.1") }`, nil); got != `{"data":{"untrack":true}}` {
				t.Fatalf("untrack: %s", got)
			}
			if got, want := w.nextRaw(), presenceNext("p", "room.1", 1, nil, []string{gqlMember(kb, "null", "null")}, nil); got != want {
				t.Fatalf("got  %s\nwant %s", got, want)
			}
			w.nextRaw() // q's
			if got := b.gqlResult("u2", `mutation { untrack(subject: "room.1") }`, nil); got != `{"data":{"untrack":true}}` {
				t.Fatalf("untrack of a non-member: %s", got)
			}
			w.gqlQuiet()

			// Completing q leaves p; the connection's end is a leave.
			w.send(`{"id":"q","type":"complete"}`)
			w.gqlQuiet()
			_ = a.c.CloseNow()
			if got, want := w.nextRaw(), presenceNext("p", "room.1", 0, nil, []string{gqlMember(ka, "null", "null")}, nil); got != want {
				t.Fatalf("got  %s\nwant %s", got, want)
			}
			// Completing p ends the watch: b's track reaches nobody.
			w.send(`{"id":"p","type":"complete"}`)
			w.gqlQuiet()
			b.gqlTrack("t5", "room.2", "1")
			w.gqlQuiet()
			e.waitSubscriptions(0)
		})
	}
}

// memberOf is key's member in TestGraphQLPresence's room: ka's state,
// or b's null.
func memberOf(key, ka string) string {
	if key == ka {
		return gqlMember(key, "null", `{"name":"ann","typing":true}`)
	}
	return gqlMember(key, "null", "null")
}

// postGraphQL posts body to /graphql with token (none: "") and returns
// the response body.
func postGraphQL(t *testing.T, e *env, tok, body string) string {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, e.http.URL+"/graphql", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// TestGraphQLPresenceErrors: the native protocol's checks and codes, as
// GraphQL errors with extensions.code: grants (a presence claim to track,
// a subscribe grant to list or watch, over WebSocket and HTTP), state
// size, the track cap and rate, bad subjects and patterns, and track and
// untrack over HTTP refused.
func TestGraphQLPresenceErrors(t *testing.T) {
	e, token := publishTokens(t, presenceCfg(func(c *gateway.Config) {
		c.AllowAnonymousPresence = false
		c.MaxPresenceState = 64
		c.MaxPresenceTracks = 2
		c.PresenceRate = 3 // burst 6: u's 6 tracks below fit
	}))
	check := func(what, payload string, want ...string) {
		t.Helper()
		codes, _ := gqlErrorCodes(t, payload)
		if !slices.Equal(codes, want) {
			t.Fatalf("%s: codes %v, want %v (%s)", what, codes, want, payload)
		}
	}
	const trackQ = `mutation($s: String!, $st: JSON) { track(subject: $s, state: $st) { member } }`

	u := e.initGQLToken(token(jwt.MapClaims{"sub": "u7", "presence": []any{"room.{tenant}.*"}, "subscribe": []any{"room.{tenant}.*"}}))
	check("a subject outside the claim", u.gqlResult("f1", trackQ, map[string]any{"s": "room.other.1"}), "forbidden")
	check("a wildcard", u.gqlResult("f2", trackQ, map[string]any{"s": "room.acme.*"}), "bad_subject")
	check("state over --max-presence-state", u.gqlResult("f3", trackQ, map[string]any{"s": "room.acme.1", "st": strings.Repeat("x", 80)}), "too_large")
	// Three tracks in one operation, over the cap of two.
	check("over --max-presence-tracks", u.gqlResult("f4", `mutation { a: track(subject: "room.acme.1") { member } b: track(subject: "room.acme.2") { member } c: track(subject: "room.acme.3") { member } }`, nil), "too_many_tracks")
	// Ten in one operation on a connection of its own: past the burst (6)
	// and what a second refills (3), tracks and untracks alike are dropped.
	r := e.initGQLToken(token(jwt.MapClaims{"sub": "u8", "presence": []any{"room.>"}}))
	var ops strings.Builder
	for i := range 10 {
		op := "track"
		sel := "{ member }"
		if i%2 == 1 {
			op, sel = "untrack", ""
		}
		fmt.Fprintf(&ops, `f%d: %s(subject: "room.acme.9") %s `, i, op, sel)
	}
	codes, _ := gqlErrorCodes(t, r.gqlResult("f5", "mutation { "+ops.String()+"}", nil))
	if len(codes) == 0 || slices.ContainsFunc(codes, func(c string) bool { return c != "rate_limited" }) {
		t.Fatalf("over --presence-rate: codes %v, want rate_limited", codes)
	}

	// The token's sub is the member's sub, whatever the state says.
	if got := u.gqlResult("m", `{ members(subject: "room.acme.1") { count members { sub state } } }`, nil); got != `{"data":{"members":{"count":1,"members":[{"sub":"u7","state":null}]}}}` {
		t.Fatalf("members: %s", got)
	}

	none := e.initGQLToken(token(jwt.MapClaims{"sub": "u9"})) // no presence claim
	check("no presence claim", none.gqlResult("n1", trackQ, map[string]any{"s": "room.acme.1"}), "forbidden")
	anon := e.initGQLToken("")
	check("anonymous without --allow-anonymous-presence", anon.gqlResult("n2", trackQ, map[string]any{"s": "room.acme.1"}), "forbidden")

	outsider := e.initGQLToken(token(jwt.MapClaims{"sub": "o", "subscribe": []any{"other.>"}}))
	check("members without a subscribe grant", outsider.gqlResult("o1", `{ members(subject: "room.acme.1") { count } }`, nil), "forbidden")
	check("a members limit out of range", outsider.gqlResult("o2", `{ members(subject: "other.1", limit: 0) { count } }`, nil), "bad_frame")
	outsider.gqlOp("o3", presenceSub, map[string]any{"s": "room.acme.*"})
	if code := outsider.gqlErrorCode("o3"); code != "forbidden" {
		t.Fatalf("presence without a subscribe grant: %s", code)
	}
	outsider.gqlOp("o4", presenceSub, map[string]any{"s": "other..x"})
	if code := outsider.gqlErrorCode("o4"); code != "bad_pattern" {
		t.Fatalf("presence on a bad pattern: %s", code)
	}
	outsider.gqlQuiet()

	// Over HTTP: members with the request's token; track and untrack refused.
	check("track over HTTP", postGraphQL(t, e, "", `{"query":"mutation { track(subject: \"room.acme.1\") { member } }"}`), "websocket_required")
	check("untrack over HTTP", postGraphQL(t, e, "", `{"query":"mutation { untrack(subject: \"room.acme.1\") }"}`), "websocket_required")
	okTok := token(jwt.MapClaims{"sub": "h", "subscribe": []any{"room.>"}})
	if got := postGraphQL(t, e, okTok, `{"query":"{ members(subject: \"room.acme.1\") { subject count members { sub } next } }"}`); got != `{"data":{"members":{"subject":"room.acme.1","count":1,"members":[{"sub":"u7"}],"next":null}}}` {
		t.Fatalf("members over HTTP: %s", got)
	}
	check("members over HTTP outside the token's grants", postGraphQL(t, e, token(jwt.MapClaims{"subscribe": []any{"other.>"}}), `{"query":"{ members(subject: \"room.acme.1\") { count } }"}`), "forbidden")
	check("members over HTTP with a bad token", postGraphQL(t, e, "not-a-token", `{"query":"{ members(subject: \"room.acme.1\") { count } }"}`), "unauthorized")
	if got := e.metric("fanwire_client_errors_total", map[string]string{"code": "too_many_tracks"}); got != 1 {
		t.Fatalf("too_many_tracks counted %v, want 1", got)
	}
}

// TestGraphQLNodePresence: the npm graphql-ws client subscribes to
// presence while another GraphQL connection tracks, updates and closes:
// it gets the join, the update and the leave, with the counts.
func TestGraphQLNodePresence(t *testing.T) {
	requireGraphQLFixture(t)
	e := newEnv(t, presenceCfg(nil))
	nc := startNode(t, e)
	nc.subscribe("p", presenceSub, map[string]any{"s": "room.*"})
	e.waitSubscriptions(1)

	a := e.initGQL()
	a.gqlTrack("t1", "room.7", `{"name":"ann"}`)
	line := nc.next()
	var m struct {
		Next struct {
			Data struct {
				Presence struct {
					Joins []struct {
						Conn string `json:"conn"`
					} `json:"joins"`
				} `json:"presence"`
			} `json:"data"`
		} `json:"next"`
	}
	if err := json.Unmarshal([]byte(line), &m); err != nil || len(m.Next.Data.Presence.Joins) != 1 {
		t.Fatalf("node client printed %s, want one join", line)
	}
	k := m.Next.Data.Presence.Joins[0].Conn
	nodeLine := func(count int, joins, leaves, updates []string) string {
		next := presenceNext("", "room.7", count, joins, leaves, updates)
		payload := next[strings.Index(next, `"payload":`)+len(`"payload":`) : len(next)-1]
		return `{"key":"p","next":` + payload + `}`
	}
	if want := nodeLine(1, []string{gqlMember(k, "null", `{"name":"ann"}`)}, nil, nil); line != want {
		t.Fatalf("node client printed\n got %s\nwant %s", line, want)
	}
	a.gqlTrack("t2", "room.7", `{"name":"ann","away":true}`)
	nc.expect(nodeLine(1, nil, nil, []string{gqlMember(k, "null", `{"away":true,"name":"ann"}`)}))
	_ = a.c.CloseNow()
	nc.expect(nodeLine(0, nil, []string{gqlMember(k, "null", "null")}, nil))
	nc.send(map[string]any{"cmd": "unsubscribe", "key": "p"})
	nc.expect(`{"unsubscribed":"p"}`)
	e.waitSubscriptions(0)
}

// TestGraphQLPresenceResume: a GraphQL client whose node stops tracks
// again on another node with the secret its track returned: the same
// member, which the watchers see change its state, never leave.
func TestGraphQLPresenceResume(t *testing.T) {
	stay := newEnv(t, presenceCfg(func(c *gateway.Config) { c.PresenceTimeout = time.Hour }))
	going := stay.sibling(presenceCfg(func(c *gateway.Config) { c.PresenceTimeout = time.Hour }))
	w := stay.dial()
	w.send(`{"type":"subscribe","id":"w","subject":"room.1","presence":true}`)
	w.expect(map[string]any{"type": "subscribed", "id": "w"})

	track := func(cl *client, id, extra string) (member, resume string) {
		t.Helper()
		got := cl.gqlResult(id, `mutation { track(subject: "room.1", state: "s"`+extra+`) { member resume } }`, nil)
		var r struct {
			Data struct {
				Track struct{ Member, Resume string }
			}
		}
		if err := json.Unmarshal([]byte(got), &r); err != nil || r.Data.Track.Member == "" {
			t.Fatalf("track: %s", got)
		}
		return r.Data.Track.Member, r.Data.Track.Resume
	}
	old := going.initGQL()
	member, secret := track(old, "t1", "")
	w.expect(map[string]any{"type": "presence", "count": 1, "joins": []any{map[string]any{"conn": member, "state": "s"}}})
	old.answerClose()
	going.stop()
	waitFor(t, "the stopping node's bye", func() bool { return stay.metric("fanwire_presence_nodes", nil) == 0 })

	again := stay.initGQL()
	if m, s := track(again, "t2", `, resume: "`+secret+`"`); m != member || s != secret {
		t.Fatalf("resumed as %s (%s), want member %s", m, s, member)
	}
	w.quiet() // the same state: nothing to tell
	gateway.SweepPresence(stay.srv, time.Now().Add(2*time.Hour))
	w.quiet() // the grace's end removes nothing: the member moved
	if keys, count := members(w, "room.1", 10); count != 1 || keys[0] != member {
		t.Fatalf("members %v (%v), want the resumed %s", keys, count, member)
	}
}
