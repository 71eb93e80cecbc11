package gateway_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	neturl "net/url"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/fanwire/fanwire/broker/brokertest"
	"github.com/fanwire/fanwire/gateway/browsertest"
	"github.com/golang-jwt/jwt/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// fanwire.js's promise and iterator API (issue 24): client.ready(),
// subscription.ready(), per-subscription listeners, for await over a
// subscription with its back-pressure, AbortSignals and publish timeouts,
// against fanwire ws processes on JetStream, in Node (run.mjs with
// api.mjs's commands) and in a headless Chromium (api.html).

// TestClientAPI: the promise and iterator API in Node and in Chromium.
func TestClientAPI(t *testing.T) {
	t.Parallel() // it mostly waits for its own processes (Node, Chromium, nodes): beside the others
	node := requireClientFixture(t)
	bin := buildFanwire(t)

	t.Run("ready and per-subscription listeners", func(t *testing.T) {
		url := brokertest.NATS(t).ClientURL()
		js := brokertest.JetStream(t, url)
		secret := writeFile(t, "secret", testSecret)
		n := startGateway(t, bin, "--broker", "jetstream", "--nats-url", url, "--stream", "APIREADY", "--subjects", "app.>", "--jwt-secret-file", secret)
		token := sign(t, jwt.SigningMethodHS256, []byte(testSecret), "", jwt.MapClaims{"sub": "u1", "exp": time.Now().Add(time.Hour).Unix(), "subscribe": []any{"app.*"}})
		c := runClient(t, node, map[string]any{"urls": []string{n.wsURL()}, "token": token}, nil)
		c.send(map[string]any{"cmd": "ready"})
		apiWait(c, "client.ready()", func(l []jsLine) bool { return has(l, "client_ready", "") || has(l, "client_ready_error", "") })
		lines := c.all()
		if ready, _ := find(lines, "client_ready", ""); ready < 0 || count(lines[:ready], "state", "connected") == 0 {
			t.Fatalf("client.ready() did not resolve after the client connected:\n%s", c.summary())
		}

		// Subscribed, then an event at a time, to onEvent and to the
		// subscription's own "event" listeners.
		publishN(t, js, 0, 5)
		c.send(map[string]any{"cmd": "subscribe", "name": "a", "pattern": "app.*", "options": map[string]any{"from": "first"}, "onEvent": true, "listen": true, "ready": true})
		apiWait(c, "a ready, and its 5 events", func(l []jsLine) bool {
			return (has(l, "sub_ready", "a") || has(l, "sub_ready_error", "a")) && len(subNs(l, "sub_event", "a")) >= 5 && len(subNs(l, "event", "a")) >= 5
		})
		lines = c.all()
		if i, l := find(lines, "sub_ready", "a"); i < 0 || l.State != "same" {
			t.Fatalf("a.ready() did not resolve with a itself:\n%s", c.summary())
		}
		if i, l := find(lines, "sub_subscribed", "a"); i < 0 || l.State != "same" || i > firstEvent(lines, "a") {
			t.Fatalf(`a's on("subscribed") was not told, with a, before its first event:`+"\n%s", c.summary())
		}
		checkSequence(t, subNs(lines, "sub_event", "a"), 5)
		checkSequence(t, subNs(lines, "event", "a"), 5)
		_, first := find(lines, "sub_event", "a")

		// Again after a reconnect, from its cursor: nothing twice.
		c.send(map[string]any{"cmd": "reconnect"})
		apiWait(c, `a's second on("subscribed")`, func(l []jsLine) bool { return count(subLines(l, "sub_subscribed", "a"), "sub_subscribed", "") >= 2 })
		publishN(t, js, 5, 6)
		apiWait(c, "a's event 5", func(l []jsLine) bool { return len(subNs(l, "sub_event", "a")) >= 6 })
		checkSequence(t, subNs(c.all(), "sub_event", "a"), 6)

		// Refused: ready() rejects with the gateway's code, and the
		// subscription's own "error" listener is told.
		// A pattern over the gateway's 64 KiB frame is refused by the
		// client itself: were it sent, the gateway would close the
		// connection (1009) before it reads g's subscribe below.
		huge := "app." + strings.Repeat("x", 70<<10)
		for _, r := range []struct{ name, pattern, code string }{{"forbidden", "app.x.y", "forbidden"}, {"outside", "other.x", "bad_pattern"}, {"huge", huge, "too_large"}} {
			c.send(map[string]any{"cmd": "subscribe", "name": r.name, "pattern": r.pattern, "listen": true, "ready": true})
			apiWait(c, r.name+".ready()", func(l []jsLine) bool { return has(l, "sub_ready_error", r.name) || has(l, "sub_ready", r.name) })
			lines := c.all()
			_, ready := find(lines, "sub_ready_error", r.name)
			_, onError := find(lines, "sub_error", r.name)
			if ready.Code != r.code || ready.State != "closed" || onError.Code != r.code || onError.State != "same" {
				t.Fatalf(`subscribing %.20s: want ready() rejected with %s, the subscription closed, and its on("error") told with it:`+"\n%s", r.pattern, r.code, c.summary())
			}
		}

		// A from the broker no longer holds: a gap on the subscription's
		// own listener, then on from "first" as its resync says.
		stream, err := js.Stream(context.Background(), "APIREADY")
		if err != nil {
			t.Fatal(err)
		}
		if err := stream.Purge(context.Background()); err != nil {
			t.Fatal(err)
		}
		publishN(t, js, 6, 8)
		c.send(map[string]any{"cmd": "subscribe", "name": "g", "pattern": "app.*", "options": map[string]any{"from": first.Cursor, "resync": "first"}, "listen": true, "ready": true})
		// ready()'s continuation is a promise's: it may come after the
		// events of the frame that confirmed the subscription.
		apiWait(c, "g's 2 events and its ready()", func(l []jsLine) bool {
			return len(subNs(l, "sub_event", "g")) >= 2 && (has(l, "sub_ready", "g") || has(l, "sub_ready_error", "g"))
		})
		lines = c.all()
		gapAt, gap := find(lines, "sub_gap", "g")
		if gapAt < 0 || gap.Reason != "cursor_expired" || gap.Cursor != first.Cursor || gap.State != "same" || gapAt > firstEvent(lines, "g") {
			t.Fatalf(`g's on("gap") was not told, before its events, that its from %s expired:`+"\n%s", first.Cursor, c.summary())
		}
		if i, _ := find(lines, "sub_ready", "g"); i < 0 {
			t.Fatalf("g.ready() did not resolve once it went on from first:\n%s", c.summary())
		}
		if got := subNs(lines, "sub_event", "g"); fmt.Sprint(got) != "[6 7]" {
			t.Fatalf("g got %v, want [6 7] (the stream from first, after the purge)", got)
		}
		if count(lines, "state", "disconnected") != 1 {
			t.Fatalf("the connection ended other than by reconnect():\n%s", c.summary())
		}

		// Closed: ready() rejects.
		c.send(map[string]any{"cmd": "close", "stay": true})
		c.send(map[string]any{"cmd": "ready"})
		apiWait(c, "client.ready() after close()", func(l []jsLine) bool { return has(l, "client_ready_error", "") })
		if _, l := find(c.all(), "client_ready_error", ""); l.Code != "closed" {
			t.Fatalf(`client.ready() after close() rejected with %v, want "closed":`+"\n%s", l.Code, c.summary())
		}
	})

	t.Run("for await", func(t *testing.T) {
		url := brokertest.NATS(t).ClientURL()
		js := brokertest.JetStream(t, url)
		n := startGateway(t, bin, jsNodeArgs(url, "APIITER")...)
		c := runClient(t, node, map[string]any{"urls": []string{n.wsURL()}}, nil)
		// it reads 20 events and breaks out; ctl, another subscription of
		// the same events, shows when the gateway has sent them all.
		c.send(map[string]any{"cmd": "subscribe", "name": "it", "pattern": "app.>", "options": map[string]any{"from": "first"}, "iterate": true, "breakAfter": 20, "ready": true})
		c.send(map[string]any{"cmd": "subscribe", "name": "ctl", "pattern": "app.>", "options": map[string]any{"from": "first"}, "onEvent": true, "ready": true})
		apiWait(c, "both subscribed", func(l []jsLine) bool { return has(l, "sub_ready", "it") && has(l, "sub_ready", "ctl") })
		publishN(t, js, 0, 30)
		apiWait(c, "ctl's 30 events and the end of it's loop", func(l []jsLine) bool {
			return len(subNs(l, "event", "ctl")) >= 30 && has(l, "iter_end", "it")
		})
		lines := c.all()
		checkSequence(t, subNs(lines, "iter", "it"), 20)
		if _, end := find(lines, "iter_end", "it"); end.Code != nil || end.State != "closed" {
			t.Fatalf("breaking out of for await: want the loop ended without an error and the subscription closed:\n%s", c.summary())
		}
		waitFor(t, "the gateway to hold ctl only (breaking out unsubscribes)", func() bool { return nodeMetric(t, n, "fanwire_subscriptions") == 1 })

		// A subscription refused for good ends its loop by throwing.
		c.send(map[string]any{"cmd": "subscribe", "name": "bad", "pattern": "other.>", "iterate": true})
		apiWait(c, "the refused subscription's loop to end", func(l []jsLine) bool { return has(l, "iter_end", "bad") })
		if _, end := find(c.all(), "iter_end", "bad"); end.Code != "bad_pattern" {
			t.Fatalf("for await over a refused subscription: want it to throw bad_pattern:\n%s", c.summary())
		}
	})

	t.Run("for await with back-pressure", func(t *testing.T) {
		url := brokertest.NATS(t).ClientURL()
		js := brokertest.JetStream(t, url)
		n := startGateway(t, bin, jsNodeArgs(url, "APIBUFFER")...)
		c := runClient(t, node, map[string]any{"urls": []string{n.wsURL()}}, nil)
		// The app reads one event, then stops pulling while 500 events
		// of 16 KiB (8 MiB in all) are published.
		const events, buffer, pad = 500, 50, 16 << 10
		c.send(map[string]any{"cmd": "subscribe", "name": "bp", "pattern": "app.>", "options": map[string]any{"from": "first", "buffer": buffer},
			"iterate": true, "pauseAfter": 1, "ready": true})
		apiWait(c, "bp subscribed", func(l []jsLine) bool { return has(l, "sub_ready", "bp") })
		c.send(map[string]any{"cmd": "heap"})
		apiWait(c, "the heap before", func(l []jsLine) bool { return has(l, "heap", "") })
		padding := strings.Repeat("x", pad)
		for i := range events {
			if _, err := js.PublishAsync("app."+strconv.Itoa(i%4), fmt.Appendf(nil, `{"n":%d,"pad":%q}`, i, padding)); err != nil {
				t.Fatal(err)
			}
		}
		select {
		case <-js.PublishAsyncComplete():
		case <-time.After(clientWait):
			t.Fatal("publishes not acknowledged")
		}
		apiWait(c, "the app to stop pulling", func(l []jsLine) bool { return has(l, "paused", "bp") })
		// Over its buffer, the iterator pauses the subscription on the
		// gateway; then the client holds at most the buffer's events.
		waitFor(t, "the paused subscription to be unsubscribed on the gateway", func() bool { return nodeMetric(t, n, "fanwire_subscriptions") == 0 })
		c.send(map[string]any{"cmd": "heap"})
		apiWait(c, "the heap while paused", func(l []jsLine) bool { return count(l, "heap", "") >= 2 })
		heaps := subNs(c.all(), "heap", "")
		// 50 events are 0.8 MiB; all 500, 8 MiB.
		if grew := heaps[1] - heaps[0]; grew > 3<<20 {
			t.Fatalf("the client's heap grew by %.1f MiB while the app did not pull (%d events of %d KiB published, buffer %d): the iterator holds more than its buffer",
				float64(grew)/(1<<20), events, pad>>10, buffer)
		}
		c.send(map[string]any{"cmd": "resume", "name": "bp"})
		apiWait(c, "all the events", func(l []jsLine) bool { return len(subNs(l, "iter", "bp")) >= events })
		checkSequence(t, subNs(c.all(), "iter", "bp"), events)
	})

	t.Run("for await with back-pressure on Core NATS", func(t *testing.T) {
		url := brokertest.NATS(t).ClientURL()
		n := startGateway(t, bin, "--broker", "nats", "--nats-url", url, "--subjects", "app.>", "--allow-anonymous")
		nc, err := nats.Connect(url)
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		publish := func(from, to int) {
			for i := from; i < to; i++ {
				if err := nc.Publish("app."+strconv.Itoa(i%4), fmt.Appendf(nil, `{"n":%d}`, i)); err != nil {
					t.Fatal(err)
				}
			}
			if err := nc.Flush(); err != nil {
				t.Fatal(err)
			}
		}
		c := runClient(t, node, map[string]any{"urls": []string{n.wsURL()}}, nil)
		c.send(map[string]any{"cmd": "subscribe", "name": "bp", "pattern": "app.>", "options": map[string]any{"buffer": 50},
			"iterate": true, "pauseAfter": 1, "listen": true, "ready": true})
		apiWait(c, "bp subscribed", func(l []jsLine) bool { return has(l, "sub_ready", "bp") })
		publish(0, 500)
		apiWait(c, "the app to stop pulling", func(l []jsLine) bool { return has(l, "paused", "bp") })
		waitFor(t, "the paused subscription to be unsubscribed on the gateway", func() bool { return nodeMetric(t, n, "fanwire_subscriptions") == 0 })
		// What was published during the pause is gone: a gap, then live.
		c.send(map[string]any{"cmd": "resume", "name": "bp"})
		apiWait(c, "bp's gap", func(l []jsLine) bool { return has(l, "sub_gap", "bp") })
		publish(500, 510)
		apiWait(c, "the events after the gap", func(l []jsLine) bool { ns := subNs(l, "iter", "bp"); return len(ns) > 0 && ns[len(ns)-1] == 509 })
		lines := c.all()
		if _, gap := find(lines, "sub_gap", "bp"); gap.Reason != "overflow" || gap.State != "same" {
			t.Fatalf(`want a gap with reason "overflow" on bp:`+"\n%s", c.summary())
		}
		got := subNs(lines, "iter", "bp")
		for i := 1; i < len(got); i++ {
			if got[i] <= got[i-1] {
				t.Fatalf("events out of order or twice at %d: %v", i, got[max(0, i-3):min(len(got), i+3)])
			}
		}
		if len(got) >= 510 || got[len(got)-10] != 500 {
			t.Fatalf("got %d events ending %v: want fewer than the 510 published (the pause lost some) and the 10 after the gap", len(got), got[max(0, len(got)-12):])
		}
	})

	t.Run("AbortSignal", func(t *testing.T) {
		url := brokertest.NATS(t).ClientURL()
		js := brokertest.JetStream(t, url)
		n := startGateway(t, bin, jsNodeArgs(url, "APIABORT", "--allow-anonymous-publish")...)
		c := runClient(t, node, map[string]any{"urls": []string{n.wsURL()}, "options": map[string]any{"backoff": map[string]any{"initial": 100, "max": 1000}}}, nil)
		// ab is aborted midway; ctl reads the same events to the end.
		c.send(map[string]any{"cmd": "subscribe", "name": "ab", "pattern": "app.>", "options": map[string]any{"from": "first"}, "abort": true, "onEvent": true, "listen": true, "ready": true})
		c.send(map[string]any{"cmd": "subscribe", "name": "ctl", "pattern": "app.>", "options": map[string]any{"from": "first"}, "onEvent": true, "ready": true})
		apiWait(c, "both subscribed", func(l []jsLine) bool { return has(l, "sub_ready", "ab") && has(l, "sub_ready", "ctl") })
		publishN(t, js, 0, 10)
		apiWait(c, "10 events each", func(l []jsLine) bool {
			return len(subNs(l, "event", "ab")) >= 10 && len(subNs(l, "event", "ctl")) >= 10
		})
		c.send(map[string]any{"cmd": "abort", "name": "ab"})
		apiWait(c, "the abort", func(l []jsLine) bool { return has(l, "aborted", "ab") })
		if _, l := find(c.all(), "aborted", "ab"); l.State != "closed" {
			t.Fatalf("an aborted subscription is not closed:\n%s", c.summary())
		}
		waitFor(t, "the aborted subscription to be unsubscribed on the gateway", func() bool { return nodeMetric(t, n, "fanwire_subscriptions") == 1 })

		// Aborted from the start: ready() rejects "aborted".
		c.send(map[string]any{"cmd": "subscribe", "name": "pre", "pattern": "app.>", "options": map[string]any{"from": "first"}, "preAborted": true, "ready": true})
		apiWait(c, "pre.ready()", func(l []jsLine) bool { return has(l, "sub_ready_error", "pre") || has(l, "sub_ready", "pre") })
		if _, l := find(c.all(), "sub_ready_error", "pre"); l.Code != "aborted" || l.State != "closed" {
			t.Fatalf(`a subscribe with an aborted signal: want ready() rejected with "aborted" and the subscription closed:`+"\n%s", c.summary())
		}

		// A publish aborted before it is sent is not published: ctl reads
		// the stream in order, and a publish sent after it is there.
		c.send(map[string]any{"cmd": "publish", "name": "p-pre", "subject": "app.0", "data": map[string]any{"n": 1000}, "preAborted": true})
		c.send(map[string]any{"cmd": "publish", "name": "p10", "subject": "app.1", "data": map[string]any{"n": 10}})
		apiWait(c, "both publishes answered", func(l []jsLine) bool { return publishAnswered(l, "p-pre") && publishAnswered(l, "p10") })
		if _, l := find(c.all(), "publish_error", "p-pre"); l.Code != "aborted" {
			t.Fatalf(`a publish with an aborted signal: want it rejected with "aborted":`+"\n%s", c.summary())
		}

		// While the node is away: one publish aborted, one timed out,
		// both waiting to be sent, are not sent when it is back.
		n.stop(syscall.SIGTERM)
		apiWait(c, "the client disconnected", func(l []jsLine) bool { return count(l, "state", "disconnected") > 0 })
		c.send(map[string]any{"cmd": "publish", "name": "p-abort", "subject": "app.2", "data": map[string]any{"n": 1001}, "abort": true})
		c.send(map[string]any{"cmd": "publish", "name": "p-timeout", "subject": "app.3", "data": map[string]any{"n": 1002}, "timeout": 300})
		c.send(map[string]any{"cmd": "publish", "name": "p11", "subject": "app.3", "data": map[string]any{"n": 11}})
		apiWait(c, "the publish's timeout", func(l []jsLine) bool { return publishAnswered(l, "p-timeout") })
		c.send(map[string]any{"cmd": "abort", "name": "p-abort"})
		apiWait(c, "the aborted publish's answer", func(l []jsLine) bool { return publishAnswered(l, "p-abort") })
		n.start()
		apiWait(c, "the publish sent once the node is back", func(l []jsLine) bool { return publishAnswered(l, "p11") })
		apiWait(c, "ctl's 12 events", func(l []jsLine) bool { return len(subNs(l, "event", "ctl")) >= 12 })
		lines := c.all()
		_, aborted := find(lines, "publish_error", "p-abort")
		_, timedOut := find(lines, "publish_error", "p-timeout")
		_, p11 := find(lines, "published", "p11")
		if aborted.Code != "aborted" || timedOut.Code != "timeout" || timedOut.Data.N < 270 || p11.K == "" {
			t.Fatalf(`while disconnected: want the aborted publish rejected with "aborted", the one with {timeout: 300} with "timeout" after 300 ms or more, and the next one published:`+"\n%s", c.summary())
		}
		checkSequence(t, subNs(lines, "event", "ctl"), 12) // 1000, 1001, 1002 would be in it
		if got := subNs(lines, "event", "ab"); len(got) != 10 {
			t.Fatalf("the aborted subscription got %d events, want the 10 before the abort", len(got))
		}
		if subs := nodeMetric(t, n, "fanwire_subscriptions"); subs != 1 {
			t.Fatalf("the node back holds %v subscriptions, want ctl's only", subs)
		}
	})

	t.Run("timeouts", func(t *testing.T) {
		url := brokertest.NATS(t).ClientURL()
		js := brokertest.JetStream(t, url)
		n := startGateway(t, bin, jsNodeArgs(url, "APITIMEOUT", "--allow-anonymous-publish")...)
		n.stop(syscall.SIGKILL) // nobody there until n.start
		backoff := map[string]any{"initial": 50, "max": 200}
		c := runClient(t, node, map[string]any{"urls": []string{n.wsURL()}, "options": map[string]any{"publishTimeout": 400, "backoff": backoff}}, nil)
		c.send(map[string]any{"cmd": "ready", "timeout": 300})
		c.send(map[string]any{"cmd": "publish", "name": "default", "subject": "app.0", "data": map[string]any{"n": 1000}})
		c.send(map[string]any{"cmd": "publish", "name": "own", "subject": "app.0", "data": map[string]any{"n": 1001}, "timeout": 1500})
		c.send(map[string]any{"cmd": "subscribe", "name": "st", "pattern": "app.>", "ready": true, "timeout": 300})
		apiWait(c, "the timeouts", func(l []jsLine) bool {
			return has(l, "client_ready_error", "") && publishAnswered(l, "default") && publishAnswered(l, "own") && has(l, "sub_ready_error", "st")
		})
		lines := c.all()
		for _, w := range []struct {
			k, name string
			ms      int
		}{{"client_ready_error", "", 300}, {"publish_error", "default", 400}, {"publish_error", "own", 1500}, {"sub_ready_error", "st", 300}} {
			// Node's timers count from the event loop's cached clock: one
			// may fire a few ms before performance.now() says it is due.
			if _, l := find(lines, w.k, w.name); l.Code != "timeout" || l.Data.N < w.ms-w.ms/10 {
				t.Fatalf(`never connected: want ready(300), a publish with publishTimeout 400, one with {timeout: 1500}, and sub.ready(300) rejected with "timeout" after that many ms or more:`+"\n%s", c.summary())
			}
		}

		// Pending when the client closes: ready() and sub.ready() reject
		// "closed".
		closing := runClient(t, node, map[string]any{"urls": []string{n.wsURL()}, "options": map[string]any{"backoff": backoff}}, nil)
		closing.send(map[string]any{"cmd": "ready"})
		closing.send(map[string]any{"cmd": "subscribe", "name": "s", "pattern": "app.>", "ready": true})
		closing.send(map[string]any{"cmd": "close", "stay": true})
		apiWait(closing, "the pending promises' end", func(l []jsLine) bool {
			return has(l, "closed", "") && has(l, "client_ready_error", "") && (has(l, "sub_ready_error", "s") || has(l, "sub_ready", "s"))
		})
		lines = closing.all()
		_, ready := find(lines, "client_ready_error", "")
		_, subReady := find(lines, "sub_ready_error", "s")
		if ready.Code != "closed" || subReady.Code != "closed" {
			t.Fatalf(`close() while connecting: want the pending client.ready() and sub.ready() rejected with "closed":`+"\n%s", closing.summary())
		}

		// The node comes: a pending ready() resolves, and what timed out
		// was never sent (a publish after it is the first in the stream).
		c.send(map[string]any{"cmd": "ready"})
		n.start()
		apiWait(c, "client.ready()", func(l []jsLine) bool { return has(l, "client_ready", "") })
		c.send(map[string]any{"cmd": "publish", "name": "after", "subject": "app.0", "data": map[string]any{"n": 0}, "timeout": 60000})
		c.send(map[string]any{"cmd": "subscribe", "name": "all", "pattern": "app.>", "options": map[string]any{"from": "first"}, "onEvent": true})
		apiWait(c, "the publish after the timeouts", func(l []jsLine) bool { return publishAnswered(l, "after") && len(subNs(l, "event", "all")) >= 1 })
		if got := subNs(c.all(), "event", "all"); got[0] != 0 {
			t.Fatalf("the stream starts with %v: a publish that timed out before it was sent was sent", got)
		}
		if msgs := streamMsgs(t, js, "APITIMEOUT"); msgs != 1 {
			t.Fatalf("the stream holds %d events, want the one published after the timeouts", msgs)
		}
	})

	t.Run("Chromium", func(t *testing.T) {
		url := brokertest.NATS(t).ClientURL()
		brokertest.JetStream(t, url)
		n := startGateway(t, bin, jsNodeArgs(url, "APIPAGE", "--allow-anonymous-publish")...)
		pages := httptest.NewServer(http.FileServer(http.Dir(clientFixture)))
		t.Cleanup(pages.Close)
		browser := browsertest.Start(t)
		page := pages.URL + "/api.html?" + neturl.Values{"gw": {n.httpURL()}}.Encode()
		run := func(t *testing.T, script string) apiPageResult {
			t.Helper()
			p := openTab(t, browser, apiPageState)
			p.Do(chromedp.Navigate(page))
			p.WaitVisible(`#status[data-state="loaded"]`)
			r := browsertest.Eval[apiPageResult](p, `(async (url) => {`+script+`})(`+strconv.Quote(n.wsURL())+`)`, chromedp.EvalAwaitPromise)
			if len(r.PageErrors) > 0 {
				t.Fatalf("uncaught on the page: %v (%+v)", r.PageErrors, r)
			}
			return r
		}

		t.Run("close while connecting", func(t *testing.T) {
			// A reconnect would come within the backoff's 100 ms; the
			// page watches for a second.
			r := run(t, `
				const states = [], errors = [];
				const c = fanwire.connect(url, {backoff: {initial: 50, max: 100}});
				c.on("state", (s, d) => states.push(s + (d.code ? " " + d.code : "")));
				c.on("error", (e) => errors.push(e.code + ": " + e.message));
				const before = c.state;
				await c.close();
				let ready = "resolved";
				try { await c.ready(); } catch (e) { ready = e.code; }
				await new Promise((resolve) => setTimeout(resolve, 1000));
				return {before, after: c.state, states, errors, ready, pageErrors};`)
			if r.Before != "connecting" || r.After != "closed" || r.Ready != "closed" || len(r.Errors) > 0 || len(r.States) == 0 ||
				!strings.HasPrefix(r.States[len(r.States)-1], "closed") || slices.ContainsFunc(r.States, hasPrefix("connected")) {
				t.Fatalf(`close() right after connect(): want the client closed (state "closed", ready() rejected "closed"), no error, no connection after it: %+v`, r)
			}
		})

		t.Run("70 KB publish", func(t *testing.T) {
			r := run(t, `
				const states = [];
				const c = fanwire.connect(url);
				c.on("state", (s, d) => states.push(s + (d.code ? " " + d.code : "")));
				await c.ready(10000);
				const opts = {timeout: 10000};
				const small = [c.publish("app.1", {n: 1}, opts)];
				let big = "published";
				const bigDone = c.publish("app.0", {n: -1, pad: "x".repeat(70 * 1024)}, opts).catch((e) => { big = e.code; });
				small.push(c.publish("app.2", {n: 2}, opts));
				await bigDone;
				const cursors = await Promise.all(small);
				const r = {big, cursors, states, after: c.state, pageErrors};
				await c.close();
				return r;`)
			if r.Big != "too_large" || len(r.Cursors) != 2 || r.Cursors[0] == "" || r.Cursors[1] == "" || r.After != "connected" || slices.ContainsFunc(r.States, hasPrefix("disconnected")) {
				t.Fatalf("a 70 KB publish: want it rejected with too_large, the publishes around it published, and the connection kept: %+v", r)
			}
		})

		t.Run("sub.ready and for await", func(t *testing.T) {
			r := run(t, `
				const c = fanwire.connect(url);
				const sub = c.subscribe("app.it.>", {from: "first"});
				const same = (await sub.ready(10000)) === sub;
				const got = [];
				const loop = (async () => {
					for await (const ev of sub) {
						got.push(ev.data.n);
						if (got.length === 20) break;
					}
				})();
				for (let i = 0; i < 25; i++) await c.publish("app.it." + (i % 4), {n: i}, {timeout: 10000});
				await loop;
				const r = {same, got, closed: sub.closed, pageErrors};
				await c.close();
				return r;`)
			if !r.Same || !r.Closed {
				t.Fatalf("want sub.ready() resolved with the subscription, and the subscription closed by breaking out of for await: %+v", r)
			}
			checkSequence(t, r.Got, 20)
		})
	})
}

// apiWait waits, like waitFor, until cond holds for r's lines, and fails at
// once if the script reports a command that threw.
func apiWait(r *nodeRun, what string, cond func([]jsLine) bool) {
	r.t.Helper()
	failed := -1
	r.waitFor(what, clientWait, func(l []jsLine) bool {
		for i := range l {
			if l[i].K == "cmd_error" {
				failed = i
				return true
			}
		}
		return cond(l)
	})
	if failed >= 0 {
		r.t.Fatalf("the client script failed while waiting for %s: %s\n%s", what, r.all()[failed].Message, r.summary())
	}
}

// subLines returns the lines of kind k for the subscription (or publish)
// named sub; with sub "", every line of kind k.
func subLines(lines []jsLine, k, sub string) []jsLine {
	var out []jsLine
	for _, l := range lines {
		if l.K == k && (sub == "" || l.Sub == sub) {
			out = append(out, l)
		}
	}
	return out
}

// subNs returns the n of subLines.
func subNs(lines []jsLine, k, sub string) []int {
	var ns []int
	for _, l := range subLines(lines, k, sub) {
		ns = append(ns, l.Data.N)
	}
	return ns
}

// find returns the first line of kind k for sub and its index, or -1.
func find(lines []jsLine, k, sub string) (int, jsLine) {
	for i, l := range lines {
		if l.K == k && (sub == "" || l.Sub == sub) {
			return i, l
		}
	}
	return -1, jsLine{}
}

func has(lines []jsLine, k, sub string) bool {
	i, _ := find(lines, k, sub)
	return i >= 0
}

// firstEvent is the index of sub's first event line of any kind.
func firstEvent(lines []jsLine, sub string) int {
	for i, l := range lines {
		if l.Sub == sub && (l.K == "event" || l.K == "sub_event" || l.K == "iter") {
			return i
		}
	}
	return len(lines)
}

func publishAnswered(lines []jsLine, name string) bool {
	return has(lines, "published", name) || has(lines, "publish_error", name)
}

// streamMsgs is how many messages the stream holds.
func streamMsgs(t *testing.T, js jetstream.JetStream, name string) uint64 {
	t.Helper()
	stream, err := js.Stream(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	info, err := stream.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Msgs
}

func hasPrefix(prefix string) func(string) bool {
	return func(s string) bool { return strings.HasPrefix(s, prefix) }
}

// apiPageState describes api.html for a failure.
const apiPageState = `JSON.stringify({status: document.getElementById("status").textContent, errors: window.pageErrors})`

// apiPageResult is what a script on api.html returns.
type apiPageResult struct {
	Before     string   `json:"before"`
	After      string   `json:"after"`
	States     []string `json:"states"`
	Errors     []string `json:"errors"`
	Ready      string   `json:"ready"`
	Big        string   `json:"big"`
	Cursors    []string `json:"cursors"`
	Same       bool     `json:"same"`
	Got        []int    `json:"got"`
	Closed     bool     `json:"closed"`
	PageErrors []string `json:"pageErrors"`
}
