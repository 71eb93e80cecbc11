package main

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// The security suite's presence attacks on what a connection makes a
// node hold (TestSecurity runs them): members replies and presence
// messages stay within --mailbox-bytes.

const secAdminKey = "admin-key-0123456789abcdef0123456789"

// secBoundedReplies starts a node with a small mailbox on the Core NATS
// at natsURL and tries both attacks on it.
func secBoundedReplies(ctx context.Context, t *testing.T, bin, natsURL string) {
	const mailbox = 128 << 10
	n := startSecNode(t, bin, "--broker", "nats", "--nats-url", natsURL, "--allow-anonymous", "--anonymous-grants", "room.>",
		"--allow-anonymous-presence", "--mailbox-bytes", strconv.Itoa(mailbox), "--max-publish-bytes", "65536", "--max-presence-state", "8192",
		"--max-message-rate", "-1", "--presence-rate", "-1", "--presence-list-limit", "2", "--presence-interval", "2s", "--admin-key", secAdminKey)
	track := func(subject string, members, size int) {
		state := `{"pad":"` + strings.Repeat("x", size) + `"}`
		for range members {
			c := n.dial(ctx, t, "")
			c.send(ctx, `{"type":"track","id":"t","subject":"`+subject+`","state":`+state+`}`)
			c.until(ctx, `"tracked"`)
		}
	}

	t.Run("members asked for and not read: closed with 4008, never more than --mailbox-bytes held", func(t *testing.T) {
		track("room.flood", 20, 8000) // a page of every member: 160 KB
		flood := dialStalled(ctx, t, n.addr)
		for range 400 {
			if err := flood.Write(ctx, websocket.MessageText, []byte(`{"type":"members","id":"m","subject":"room.flood","limit":1000}`)); err != nil {
				t.Fatal(err)
			}
		}
		waitEvery(t, 20*time.Second, 10*time.Millisecond, "400 members requests not read: a slow consumer", func() bool {
			if q := n.mostQueued(t); q > mailbox {
				t.Fatalf("a mailbox of %d bytes, over --mailbox-bytes %d", q, mailbox)
			}
			return n.metric(t, "fanwire_slow_consumers_total") == 1
		})
		if q := n.mostQueued(t); q > mailbox {
			t.Fatalf("a mailbox of %d bytes, over --mailbox-bytes %d", q, mailbox)
		}
		for {
			if _, _, err := flood.Read(ctx); err != nil {
				if websocket.CloseStatus(err) != 4008 {
					t.Fatalf("the flooding client: %v, want close 4008", err)
				}
				break
			}
		}
		c := n.dial(ctx, t, "")
		c.send(ctx, `{"type":"members","id":"again","subject":"room.flood"}`)
		if msg := c.until(ctx, `"again"`); !strings.Contains(msg, `"next"`) || len(msg) > mailbox/4 {
			t.Fatalf("members after the flood: %d bytes %.200s; want a page of at most %d bytes with next", len(msg), msg, mailbox/4)
		}
	})

	t.Run("a room's churn past a watcher's mailbox reaches it whole, in pieces", func(t *testing.T) {
		w := n.dial(ctx, t, "")
		w.c.SetReadLimit(1 << 20) // a frame carries several messages
		w.send(ctx, `{"type":"subscribe","id":"w","subject":"room.batch","presence":true}`)
		w.until(ctx, `"subscribed"`)
		track("room.batch", 60, 3000) // 180 KB of joins, most within one interval
		rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		joins := map[string]bool{}
		for len(joins) < 60 {
			msg := w.until(rctx, `"presence"`)
			if len(msg) > mailbox/4 {
				t.Fatalf("a presence message of %d bytes, over a quarter of --mailbox-bytes", len(msg))
			}
			var m struct{ Joins []struct{ Conn string } }
			if err := json.Unmarshal([]byte(msg), &m); err != nil {
				t.Fatal(err)
			}
			for _, j := range m.Joins {
				joins[j.Conn] = true
			}
		}
		if s := n.metric(t, "fanwire_slow_consumers_total"); s != 1 { // the flood's only
			t.Fatalf("%v slow consumers", s)
		}
	})
}

// dialStalled connects a native client with a 4 KiB receive buffer that
// reads nothing until the test does: its socket fills at once.
func dialStalled(ctx context.Context, t *testing.T, addr string) *websocket.Conn {
	t.Helper()
	d := &net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		if err := rc.Control(func(fd uintptr) {
			serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4<<10)
		}); err != nil {
			return err
		}
		return serr
	}}
	tr := &http.Transport{DialContext: d.DialContext}
	t.Cleanup(tr.CloseIdleConnections)
	c, _, err := websocket.Dial(ctx, "ws://"+addr+"/ws", &websocket.DialOptions{HTTPClient: &http.Client{Transport: tr}})
	if err != nil {
		t.Fatal(err)
	}
	c.SetReadLimit(64 << 20)
	t.Cleanup(func() { _ = c.CloseNow() })
	return c
}

// mostQueued is the node's largest mailbox in bytes, from the inspector.
func (n *secNode) mostQueued(t *testing.T) int {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, "http://"+n.addr+"/admin/connections?limit=1000", nil)
	req.Header.Set("Authorization", "Bearer "+secAdminKey)
	code, body := secDo(t, req)
	var l struct {
		Connections []struct {
			MailboxBytes int `json:"mailbox_bytes"`
		} `json:"connections"`
	}
	if err := json.Unmarshal([]byte(body), &l); code != http.StatusOK || err != nil {
		t.Fatalf("GET /admin/connections: %d %.200s", code, body)
	}
	most := 0
	for _, c := range l.Connections {
		most = max(most, c.MailboxBytes)
	}
	return most
}
