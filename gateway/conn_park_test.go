package gateway_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/fanwire/fanwire/gateway"
)

// TestIdleReadersPark: a connection whose client has nothing more to say
// holds no reader goroutine (fanwire_connections_parked counts it), yet
// everything a reader does still happens: events are delivered, a
// message from the client is read and answered (and the reader parks
// again), a client's close ends the connection, and a shutdown closes
// parked connections with 1001 and returns.
func TestIdleReadersPark(t *testing.T) {
	e := newEnv(t, nil)
	const n = 20
	clients := make([]*client, n)
	for i := range clients {
		clients[i] = e.dial()
		clients[i].subscribe("s1", "park.x")
	}
	parked := func(want float64) func() bool {
		return func() bool { return e.metric("fanwire_connections_parked", nil) == want }
	}
	waitFor(t, "every reader parked", parked(n))

	e.publish("park.x", `{"n":1}`)
	for i, cl := range clients {
		if m := cl.next(); m["type"] != "event" || m["subject"] != "park.x" {
			t.Fatalf("client %d: %v, want the event", i, m)
		}
	}
	// Each message wakes its reader, is answered, and the reader parks
	// again once it has handled all the client sent.
	for _, cl := range clients {
		cl.send(`{"type":"ping"}`)
		cl.send(`{"type":"subscribe","id":"s2","subject":"park.y"}`)
	}
	for i, cl := range clients {
		if m := cl.next(); m["type"] != "pong" {
			t.Fatalf("client %d: %v, want pong", i, m)
		}
		cl.expect(map[string]any{"type": "subscribed", "id": "s2"})
	}
	waitFor(t, "every reader parked again", parked(n))
	e.publish("park.y", `{"n":2}`)
	for i, cl := range clients {
		if m := cl.next(); m["type"] != "event" || m["subject"] != "park.y" {
			t.Fatalf("client %d: %v, want the event on park.y", i, m)
		}
	}

	// A client's close ends its connection.
	if err := clients[0].c.Close(websocket.StatusNormalClosure, ""); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the closed connection gone", func() bool {
		return e.metric("fanwire_connections", nil) == n-1 && e.metric("fanwire_connections_parked", nil) == n-1
	})

	// A client that went away without a word (its socket closed under
	// it) is noticed by the poller: the EOF wakes the reader.
	_ = clients[1].c.CloseNow()
	waitFor(t, "the dropped connection gone", func() bool { return e.metric("fanwire_connections", nil) == n-2 })

	// Shutdown closes the parked connections with 1001 and returns.
	stopped := make(chan struct{})
	go func() { e.stop(); close(stopped) }()
	for i, cl := range clients[2:] {
		if code := cl.closeStatus(10 * time.Second); code != websocket.StatusGoingAway {
			t.Fatalf("client %d: close %v, want 1001", i+2, code)
		}
	}
	<-stopped
}

// TestParkedReaderAnswersPings: an idle client that answers the server's
// pings keeps its connection, and its reader parks again after each pong
// (the pong is taken off the socket without waiting for a data message).
// Each ping waits for its pong before the next is scheduled, so a client
// that has seen many pings has had its pongs recognised.
func TestParkedReaderAnswersPings(t *testing.T) {
	e := newEnv(t, func(c *gateway.Config) {
		c.PingInterval = 20 * time.Millisecond
		c.PingTimeout = time.Minute // an unrecognised pong would stall the pings, not close
	})
	var pings atomic.Int64
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	ws, _, err := websocket.Dial(ctx, e.wsURL(), &websocket.DialOptions{
		OnPingReceived: func(context.Context, []byte) bool { pings.Add(1); return true },
	})
	if err != nil {
		t.Fatal(err)
	}
	defer ws.CloseNow()
	if _, b, err := ws.Read(ctx); err != nil || !strings.Contains(string(b), `"ready"`) {
		t.Fatalf("first message %q, %v", b, err)
	}
	readCtx := ws.CloseRead(ctx) // reads on, answering pings
	waitFor(t, "ten pings answered", func() bool { return pings.Load() >= 10 })
	waitFor(t, "the reader parked again", func() bool { return e.metric("fanwire_connections_parked", nil) == 1 })
	if readCtx.Err() != nil || e.metric("fanwire_connections", nil) != 1 {
		t.Fatalf("connection closed (%v)", context.Cause(readCtx))
	}
}
