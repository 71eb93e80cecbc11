package gateway_test

import (
	"encoding/json"
	"slices"
	"strconv"
	"strings"
	"testing"

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
