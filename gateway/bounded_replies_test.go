package gateway_test

import (
	"bytes"
	"context"
	"encoding/json"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/fanwire/fanwire/gateway"
)

// Every byte a connection can make the node hold is bounded (issue 37):
// replies count against --mailbox-bytes as events do; members pages and
// presence messages are cut to fit it; a view's synced waits for room, or
// fails its subscribe when it could never fit.

// fillRoom makes n new connections members of subject, each with a state
// of size bytes; it returns their keys in order.
func fillRoom(t *testing.T, e *env, subject string, n, size int) []string {
	t.Helper()
	state := `{"pad":"` + strings.Repeat("x", size-len(`{"pad":""}`)) + `"}`
	keys := make([]string, 0, n)
	for range n {
		c := e.dial()
		c.send(`{"type":"track","id":"t","subject":"` + subject + `","state":` + state + `}`)
		c.expect(map[string]any{"type": "tracked", "id": "t"})
		keys = append(keys, c.id)
	}
	slices.Sort(keys)
	return keys
}

// inspected is a connection as the inspector lists it (the fields these
// tests read).
type inspected struct {
	ID            string         `json:"id"`
	MailboxBytes  int            `json:"mailbox_bytes"`
	Subscriptions []inspectedSub `json:"subscriptions"`
}

// inspectedSub is one subscription of an inspected connection.
type inspectedSub struct {
	ID      string `json:"id"`
	Live    bool   `json:"live"`
	Waiting bool   `json:"waiting"`
}

// inspect lists the node's connections through the inspector (the env
// needs AdminKey: testAdminKey).
func (e *env) inspect() []inspected {
	e.t.Helper()
	var l struct {
		Connections []inspected `json:"connections"`
		Next        string      `json:"next"`
	}
	if st := e.adminDo("GET", "/admin/connections?limit=1000", testAdminKey, "", &l); st != 200 || l.Next != "" {
		e.t.Fatalf("GET /admin/connections: %d, next %q", st, l.Next)
	}
	return l.Connections
}

// mostQueued is the largest mailbox on the node, in bytes.
func (e *env) mostQueued() int {
	n := 0
	for _, c := range e.inspect() {
		n = max(n, c.MailboxBytes)
	}
	return n
}

// writeRaw writes one text message to c.
func writeRaw(t *testing.T, c *websocket.Conn, msg string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.Write(ctx, websocket.MessageText, []byte(msg)); err != nil {
		t.Fatal(err)
	}
}

// TestMembersFloodIsBoundedByTheMailbox: a client that asks for a big
// room's members again and again and does not read is a slow consumer:
// its replies count against --mailbox-bytes, it is closed with 4008 once
// they fill it, and the node never holds more than the bound for it,
// however many it asked for. (Replies once ignored the byte bound: each
// request left a whole page queued until the client read.)
func TestMembersFloodIsBoundedByTheMailbox(t *testing.T) {
	const mailbox, requests = 128 << 10, 400
	e := newEnv(t, presenceCfg(func(c *gateway.Config) {
		c.MailboxBytes, c.MaxPublishBytes = mailbox, 64<<10
		c.MaxPresenceState = 8 << 10
		c.MaxMessageRate = -1
		c.AdminKey = testAdminKey
		c.CloseTimeout = time.Minute // the flooding client reads only at the end
	}))
	fillRoom(t, e, "room.big", 20, 8<<10) // a whole page: 160 KiB
	flood := dialRaw(t, e, true)          // a 4 KiB receive buffer it does not read
	peak := 0
	for i := range requests {
		writeRaw(t, flood, `{"type":"members","id":"m`+strconv.Itoa(i)+`","subject":"room.big","limit":1000}`)
		if i%50 == 49 {
			peak = max(peak, e.mostQueued())
		}
	}
	// Its last message: handled only while the connection is open.
	writeRaw(t, flood, `{"type":"track","id":"done","subject":"flood.done"}`)
	waitFor(t, "every request handled, or the connection found slow", func() bool {
		return e.metric("fanwire_slow_consumers_total", nil) == 1 || e.metric("fanwire_presence_local_members", nil) == 21
	})
	peak = max(peak, e.mostQueued())
	slow := e.metric("fanwire_slow_consumers_total", nil)
	t.Logf("%d members requests, not read, --mailbox-bytes %d: slow consumer %v, the largest mailbox seen %d bytes", requests, mailbox, slow == 1, peak)
	if slow != 1 || peak > mailbox {
		t.Fatalf("after %d members requests: slow consumers %v, a mailbox of %d bytes; want the client closed as a slow consumer, no mailbox over %d", requests, slow, peak, mailbox)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	replies, size := 0, 0
	for {
		_, b, err := flood.Read(ctx)
		if err != nil {
			if code := websocket.CloseStatus(err); code != gateway.CloseSlowConsumer {
				t.Fatalf("the flooding client's connection ended with %v, want 4008", err)
			}
			break
		}
		size += len(b)
		for _, line := range bytes.Split(b, []byte("\n")) {
			if !bytes.HasPrefix(line, []byte(`{"type":"members",`)) {
				t.Fatalf("the flooding client got %.100s, want members replies", line)
			}
			replies++
		}
	}
	t.Logf("closed with 4008 after %d replies (%d bytes, what its socket held and the writer had taken)", replies, size)
	waitFor(t, "slow_consumer counted", func() bool {
		return e.metric("fanwire_disconnects_total", map[string]string{"reason": "slow_consumer"}) == 1
	})
}

// TestMembersPagesByBytes: a members page ends early, with next, when its
// reply would pass a quarter of --mailbox-bytes, and next continues
// exactly: every member once, in key order, over the native protocol and
// the GraphQL query alike. limit still cuts a page shorter.
func TestMembersPagesByBytes(t *testing.T) {
	const mailbox = 64 << 10
	const page = mailbox / 4
	e := newEnv(t, presenceCfg(func(c *gateway.Config) {
		c.MailboxBytes, c.MaxPublishBytes = mailbox, 16<<10
		c.MaxPresenceState = 4 << 10
		c.MaxMessageRate = -1
	}))
	keys := fillRoom(t, e, "room.p", 30, 3000) // about 90 KB of members
	cl := e.dial()
	var got []string
	after, pages := "", 0
	for {
		req := `{"type":"members","id":"m","subject":"room.p","limit":1000`
		if after != "" {
			req += `,"after":"` + after + `"`
		}
		cl.send(req + "}")
		m, raw := cl.pop()
		if m["type"] != "members" || m["count"] != float64(30) {
			t.Fatalf("got %.200s, want a members page with count 30", raw)
		}
		if len(raw) > page {
			t.Fatalf("page %d is %d bytes, over a quarter of --mailbox-bytes (%d)", pages, len(raw), page)
		}
		pages++
		for _, v := range m["members"].([]any) {
			got = append(got, v.(map[string]any)["conn"].(string))
		}
		next, _ := m["next"].(string)
		if next == "" {
			break
		}
		if next != got[len(got)-1] {
			t.Fatalf("next %q, want the page's last member %q", next, got[len(got)-1])
		}
		after = next
	}
	if !slices.Equal(got, keys) || pages < 5 {
		t.Fatalf("%d pages listed %d members %v, want each of the %d once, in order, in pages of at most %d bytes", pages, len(got), got, len(keys), page)
	}
	cl.send(`{"type":"members","id":"l","subject":"room.p","limit":2}`)
	if m := cl.expect(map[string]any{"type": "members", "id": "l", "next": keys[1]}); len(m["members"].([]any)) != 2 {
		t.Fatalf("limit 2: %v", m)
	}

	// The GraphQL query (here over HTTP) pages the same way.
	got = got[:0]
	after, pages = "", 0
	for {
		args := `subject: \"room.p\", limit: 1000`
		if after != "" {
			args += `, after: \"` + after + `\"`
		}
		q := `{ members(` + args + `) { count next members { conn state } } }`
		body := postGraphQL(t, e, "", `{"query":"`+q+`"}`)
		if len(body) > page {
			t.Fatalf("GraphQL page %d is %d bytes, over %d", pages, len(body), page)
		}
		var r struct {
			Data struct {
				Members struct {
					Count   int
					Next    *string
					Members []struct{ Conn string }
				}
			}
		}
		if err := json.Unmarshal([]byte(body), &r); err != nil || r.Data.Members.Count != 30 {
			t.Fatalf("GraphQL members: %.200s (%v)", body, err)
		}
		pages++
		for _, m := range r.Data.Members.Members {
			got = append(got, m.Conn)
		}
		if r.Data.Members.Next == nil {
			break
		}
		after = *r.Data.Members.Next
	}
	if !slices.Equal(got, keys) || pages < 5 {
		t.Fatalf("GraphQL: %d pages listed %v, want %v in pages of at most %d bytes", pages, got, keys, page)
	}
}

// TestPresenceBatchSplitToFitTheMailbox: a big room's coalesced changes
// of an interval, three times what a watcher's mailbox holds, reach its
// native and GraphQL watchers as several presence messages of at most a
// quarter of --mailbox-bytes each, at most half a mailbox per tick, each
// with the room's count: every join arrives, none twice, and no watcher
// is closed. (Such a batch was once one message over the mailbox, skipped
// for every watcher without a trace.)
func TestPresenceBatchSplitToFitTheMailbox(t *testing.T) {
	const mailbox, n = 64 << 10, 60
	e := newEnv(t, presenceCfg(func(c *gateway.Config) {
		c.MailboxBytes, c.MaxPublishBytes = mailbox, 16<<10
		c.MaxPresenceState = 4 << 10
		c.PresenceListLimit = 2
		c.PresenceInterval = time.Hour // flushed by the test
		c.PresenceRate = 1000
		c.MaxMessageRate = -1
	}))
	w := e.dial()
	w.send(`{"type":"subscribe","id":"w","subject":"room.big","presence":true}`)
	w.expect(map[string]any{"type": "subscribed", "id": "w"})
	g := e.initGQL()
	g.gqlOp("p", presenceSub, map[string]any{"s": "room.big"})
	g.gqlQuiet()
	keys := fillRoom(t, e, "room.big", n, 3000) // about 180 KB of joins

	native, gql := map[string]int{}, map[string]int{} // key → joins seen
	msgs, counts := 0, map[float64]int{}
	readNative := func() { // up to a pong: every message queued before the ping
		w.send(`{"type":"ping"}`)
		for {
			m, raw := w.pop()
			if m["type"] == "pong" {
				return
			}
			if m["type"] != "presence" || len(raw) > mailbox/4 {
				t.Fatalf("watcher got %d bytes: %.200s; want presence messages of at most %d bytes", len(raw), raw, mailbox/4)
			}
			for _, v := range m["joins"].([]any) {
				native[v.(map[string]any)["conn"].(string)]++
			}
			counts[m["count"].(float64)]++
			msgs++
		}
	}
	readGQL := func() {
		g.send(`{"type":"ping"}`)
		for {
			raw := g.nextRaw()
			if raw == `{"type":"pong"}` {
				return
			}
			var m struct {
				ID      string
				Payload struct {
					Data struct {
						Presence struct{ Joins []struct{ Conn string } }
					}
				}
			}
			if err := json.Unmarshal([]byte(raw), &m); err != nil || m.ID != "p" {
				t.Fatalf("GraphQL watcher got %.200s", raw)
			}
			for _, j := range m.Payload.Data.Presence.Joins {
				gql[j.Conn]++
			}
		}
	}
	// The first two joined at once, under the list limit; each tick then
	// queues at most half a mailbox, which the watchers read before the next.
	ticks := 0
	for ; len(native) < n || len(gql) < n; ticks++ {
		if ticks > 20 {
			t.Fatalf("after %d ticks: %d native and %d GraphQL joins of %d", ticks, len(native), len(gql), n)
		}
		if ticks > 0 {
			gateway.FlushPresence(e.srv)
		}
		readNative()
		readGQL()
	}
	t.Logf("%d joins of 3 KB, --mailbox-bytes %d: %d presence messages over %d ticks", n, mailbox, msgs, ticks-1)
	for k, seen := range native {
		if seen != 1 || gql[k] != 1 || !slices.Contains(keys, k) {
			t.Fatalf("join of %s seen %d times, in GraphQL %d times", k, seen, gql[k])
		}
	}
	if msgs < 8 || counts[float64(n)] != msgs-2 {
		t.Fatalf("%d presence messages for %d joins of 3 KB, counts %v: want pieces of at most %d bytes, each but the first two with the room's count %d", msgs, n, counts, mailbox/4, n)
	}
	if d := e.metric("fanwire_presence_messages_dropped_total", nil); d != 0 {
		t.Fatalf("%v presence messages dropped", d)
	}
	if s := e.metric("fanwire_slow_consumers_total", nil); s != 0 {
		t.Fatalf("%v slow consumers", s)
	}
}

// TestMemberOverTheMailbox: a member whose change alone is more than a
// watcher's mailbox holds (a state near --max-presence-state, a tiny
// --mailbox-bytes) is not sent to it, counted under
// fanwire_presence_messages_dropped_total{reason="too_large"}; a members
// page that would hold it is refused with too_large, naming the member to
// page on after; the connections live on.
func TestMemberOverTheMailbox(t *testing.T) {
	e := newEnv(t, presenceCfg(func(c *gateway.Config) {
		c.MailboxBytes, c.MaxPublishBytes = 2048, 1024
		c.MaxPresenceState = 4 << 10
	}))
	w := e.dial()
	w.send(`{"type":"subscribe","id":"w","subject":"room.1","presence":true}`)
	w.expect(map[string]any{"type": "subscribed", "id": "w"})
	big := fillRoom(t, e, "room.1", 1, 3000)[0]
	waitFor(t, "the change counted", func() bool {
		return e.metric("fanwire_presence_messages_dropped_total", map[string]string{"reason": "too_large"}) == 1
	})
	small := e.dial()
	small.send(`{"type":"track","id":"t","subject":"room.1","state":1}`)
	small.expect(map[string]any{"type": "tracked", "id": "t"})
	w.expect(map[string]any{"type": "presence", "count": 2, "joins": []any{map[string]any{"conn": small.id, "state": 1}}})

	if big > small.id { // the big member first
		w.send(`{"type":"members","id":"m","subject":"room.1","after":"` + small.id + `"}`)
	} else {
		w.send(`{"type":"members","id":"m","subject":"room.1"}`)
	}
	m := w.expect(map[string]any{"type": "error", "id": "m", "code": "too_large"})
	if msg := m["message"].(string); !strings.Contains(msg, "--mailbox-bytes") || !strings.Contains(msg, `"after":"`+big+`"`) {
		t.Fatalf("message %q: want --mailbox-bytes and how to page on", msg)
	}
	w.send(`{"type":"members","id":"m2","subject":"room.1","after":"` + big + `"}`)
	w.expect(map[string]any{"type": "members", "id": "m2", "count": 2})
	w.quiet()
}

// TestViewSyncedOverTheMailbox: a filtered view's resume ends with a
// synced listing every subject the view holds. One that could never fit
// the connection's mailbox fails the subscribe with too_large, naming
// --mailbox-bytes (it was once queued past the bound). One that fits the
// mailbox but not what is free waits for the client to read: the view is
// not live meanwhile and the mailbox stays within its bound; then synced
// arrives whole.
func TestViewSyncedOverTheMailbox(t *testing.T) {
	const views = 300
	long := strings.Repeat("k", 60)
	store := func(e *env) (last string) {
		for i := range views {
			last = e.store("orders."+long+strconv.Itoa(i), row("insert", i, doc("open", 200)))
		}
		return last // about 22 KB of keys
	}
	const where = `"doc.status == 'open'"`

	t.Run("never fits", func(t *testing.T) {
		e := newEnvOn(t, "jetstream", func(c *gateway.Config) { c.MailboxBytes, c.MaxPublishBytes = 16<<10, 8<<10 })
		last := store(e)
		cl := e.dial()
		cl.keepSynced = true
		cl.send(`{"type":"subscribe","id":"v","subject":"orders.*","where":` + where + `,"from":"` + last + `"}`)
		cl.expect(map[string]any{"type": "subscribed", "id": "v"})
		m, raw := cl.pop()
		if msg, _ := m["message"].(string); m["type"] != "error" || m["id"] != "v" || m["code"] != "too_large" ||
			!strings.Contains(msg, "--mailbox-bytes") || !strings.Contains(msg, "narrow the view") {
			t.Fatalf("got %d bytes: %.300s; want a too_large error for v saying what to raise or narrow", len(raw), raw)
		}
		cl.quiet()
		e.waitSubscriptions(0)
	})

	t.Run("waits for room", func(t *testing.T) {
		const mailbox = 32 << 10
		e, gate := newEnvGated(t, "jetstream", func(c *gateway.Config) {
			c.MailboxBytes, c.MaxPublishBytes = mailbox, 8<<10
			c.AdminKey = testAdminKey
			c.CloseTimeout = time.Minute
		})
		last := store(e)
		c, addr := dialRawAddr(t, e, false)
		subscribeRaw(t, c, "fill", "app.fill")
		// The client reads nothing: its writer waits at the gate with the
		// first fill event, and what follows stays queued. Queue more than
		// the synced leaves free (16 KiB, at most 8 KiB more: within the
		// bound).
		gate.hold(addr)
		pad := strings.Repeat("f", 7<<10)
		for i := 1; i == 1 || e.mostQueued() <= 16<<10; i++ {
			e.store("app.fill", `"`+pad+`"`)
			waitFor(t, "the fill event queued", func() bool { return e.metric("fanwire_deliveries_total", nil) == float64(i) })
			if i == 1 {
				waitFor(t, "the writer held at the gate", func() bool { return gate.waitingWrites() > 0 })
			}
		}
		writeRaw(t, c, `{"type":"subscribe","id":"v","subject":"orders.*","where":`+where+`,"from":"`+last+`"}`)
		var v inspected
		waitFor(t, "the view's synced waiting for room", func() bool {
			v = e.inspect()[0]
			return slices.ContainsFunc(v.Subscriptions, func(s inspectedSub) bool { return s.ID == "v" && s.Waiting })
		})
		for _, s := range v.Subscriptions {
			if s.ID == "v" && s.Live {
				t.Fatalf("the view is live with its synced queued over what was free: %d bytes queued (bound %d)", v.MailboxBytes, mailbox)
			}
		}
		if v.MailboxBytes > mailbox {
			t.Fatalf("%d bytes queued, over the bound %d", v.MailboxBytes, mailbox)
		}
		gate.hold("")
		// The client reads: the fill, subscribed, then synced with every key.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		for synced := false; !synced; {
			_, b, err := c.Read(ctx)
			if err != nil {
				t.Fatalf("reading: %v", err)
			}
			for _, line := range bytes.Split(b, []byte("\n")) {
				var m map[string]any
				if err := json.Unmarshal(line, &m); err != nil {
					t.Fatal(err)
				}
				switch m["type"] {
				case "event", "subscribed":
				case "synced":
					if keys, _ := m["keys"].([]any); len(keys) != views {
						t.Fatalf("synced with %d keys, want %d", len(keys), views)
					}
					synced = true
				default:
					t.Fatalf("got %.200s", line)
				}
			}
		}
		e.waitSubscriptions(2)
		if s := e.metric("fanwire_slow_consumers_total", nil); s != 0 {
			t.Fatalf("%v slow consumers", s)
		}
	})
}

// TestGraphQLResultOverTheMailbox: a GraphQL operation whose result could
// never fit the connection's mailbox (here six members fields, each a
// page within its budget) is answered with a too_large error instead, and
// the connection lives on; one members field pages by bytes over
// WebSocket as over HTTP.
func TestGraphQLResultOverTheMailbox(t *testing.T) {
	const mailbox = 64 << 10
	e := newEnv(t, presenceCfg(func(c *gateway.Config) {
		c.MailboxBytes, c.MaxPublishBytes = mailbox, 16<<10
		c.MaxPresenceState = 4 << 10
		c.MaxMessageRate = -1
	}))
	keys := fillRoom(t, e, "room.p", 30, 3000)
	g := e.initGQL()
	one := g.gqlResult("one", `{ members(subject: "room.p", limit: 1000) { next members { conn } } }`, nil)
	var r struct {
		Data struct {
			Members struct {
				Next    string
				Members []struct{ Conn string }
			}
		}
	}
	if err := json.Unmarshal([]byte(one), &r); err != nil || len(r.Data.Members.Members) == 0 || len(r.Data.Members.Members) >= len(keys) ||
		r.Data.Members.Next != r.Data.Members.Members[len(r.Data.Members.Members)-1].Conn {
		t.Fatalf("one members field: %.300s; want a page cut by bytes, with next", one)
	}
	q := "{"
	for i := range 6 {
		q += " m" + strconv.Itoa(i) + `: members(subject: "room.p", limit: 1000) { members { conn state } }`
	}
	got := g.gqlResult("six", q+" }", nil)
	if codes, data := gqlErrorCodes(t, got); !slices.Equal(codes, []string{"too_large"}) || data != nil || !strings.Contains(got, "--mailbox-bytes") {
		t.Fatalf("six members fields: %.300s; want only a too_large error naming --mailbox-bytes", got)
	}
	g.gqlQuiet()
}
