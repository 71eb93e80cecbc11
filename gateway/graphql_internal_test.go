package gateway

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/99designs/gqlgen/graphql"
	"github.com/coder/websocket"
	"github.com/fanwire/fanwire/broker"
	"github.com/fanwire/fanwire/broker/brokertest"
	"github.com/fanwire/fanwire/gateway/internal/fanout"
	"github.com/fanwire/fanwire/gateway/internal/netconn"
	"github.com/fanwire/fanwire/schema"
	"github.com/vektah/gqlparser/v2/gqlerror"
)

// newTestServer builds a Server on an embedded NATS (not run: these tests
// drive its parts directly).
func newTestServer(t testing.TB) *Server {
	t.Helper()
	ns := brokertest.NATS(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	b, err := broker.DialNATS(ctx, broker.NATSConfig{Server: ns})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	s, err := New(Config{Broker: b})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// gqlOpFor builds the op a connection would for query, through the same
// parse, validation and field collection as gqlSubscribe.
func gqlOpFor(t testing.TB, s *Server, id string, legacy bool, query string, vars map[string]any, executorOnly bool) *gqlOp {
	t.Helper()
	ctx := graphql.StartOperationTrace(context.Background())
	opCtx, errs := s.gqlExec.CreateOperationContext(ctx, &graphql.RawParams{Query: query, Variables: vars})
	if errs != nil {
		t.Fatalf("%s: %v", query, errs)
	}
	root := graphql.CollectFields(opCtx, opCtx.Operation.SelectionSet, []string{"Subscription"})
	if len(root) != 1 {
		t.Fatalf("%s: %d root fields", query, len(root))
	}
	return s.newGQLOp(ctx, id, legacy, opCtx, root[0], executorOnly)
}

// TestGraphQLFastPathMatchesExecutor: for every selection the fast path
// serves, its next message is byte for byte what gqlgen's executor produces
// for the same event; selections it does not serve fall back.
func TestGraphQLFastPathMatchesExecutor(t *testing.T) {
	s := newTestServer(t)
	queries := []struct {
		q    string
		vars map[string]any
		fast bool
	}{
		{q: `subscription { events(subject: "orders.>") { subject cursor data } }`, fast: true},
		{q: `subscription { events(subject: "orders.>") { data } }`, fast: true},
		{q: `subscription { events(subject: "orders.>") { data cursor subject __typename } }`, fast: true},
		{q: `subscription Live($s: String!) { live: events(subject: $s) { d: data s: subject c: cursor t: __typename } }`, vars: map[string]any{"s": "orders.*"}, fast: true},
		{q: `subscription { events(subject: "orders.>") { subject subject data } }`, fast: true},
		{q: `subscription { events(subject: "orders.>") { ...F cursor } } fragment F on Event { data subject }`, fast: true},
		{q: `subscription { events(subject: "orders.>") { ... on Event { data } subject } }`, fast: true},
		{q: `subscription($on: Boolean!) { events(subject: "orders.>") { data @include(if: $on) subject @skip(if: $on) cursor } }`, vars: map[string]any{"on": true}, fast: true},
		{q: `subscription($on: Boolean!) { events(subject: "orders.>") { data @include(if: $on) subject @skip(if: $on) cursor } }`, vars: map[string]any{"on": false}, fast: true},
		{q: `subscription { events(subject: "orders.>") { __typename } }`, fast: true},
	}
	cursor := "js:42"
	events := []struct{ subject, cursor, data string }{
		{"orders.42", cursor, `{"id":42,"status":"paid"}`},
		{"orders.43", "", `{"id":43}`},
		{"orders.x", "rs:1700000000000-3", `[1,2.5e3,null,true,"x"]`},
		{"orders.\"q\\", cursor, `"a string"`},
		{"orders.ünïcode", cursor, `{"html":"<a href='x'>&amp;</a>","u":"\u2028 é \" \\ \n"}`},
		{"orders.n", cursor, `null`},
		{"orders.big", cursor, `{"pad":"` + strings.Repeat("x", 4000) + `","nested":{"a":[{"b":{}}]}}`},
	}
	for qi, q := range queries {
		for _, legacy := range []bool{false, true} {
			fast := gqlOpFor(t, s, "op-"+fmt.Sprint(qi), legacy, q.q, q.vars, false)
			exec := gqlOpFor(t, s, "op-"+fmt.Sprint(qi), legacy, q.q, q.vars, true)
			if fast.fast != q.fast {
				t.Errorf("query %d: fast path %v, want %v", qi, fast.fast, q.fast)
			}
			if exec.fast {
				t.Fatalf("query %d: executorOnly built a fast op", qi)
			}
			for _, e := range events {
				ev, err := fanout.NewEvent(e.subject, e.cursor, []byte(e.data))
				if err != nil {
					t.Fatal(err)
				}
				got := fast.appendNext(nil, ev)
				want := exec.appendNext(nil, ev)
				if fast.fast && fast.nextLen(ev) != len(got) {
					t.Errorf("query %d: nextLen %d, message %d bytes", qi, fast.nextLen(ev), len(got))
				}
				if !bytes.Equal(got, want) {
					t.Errorf("query %d legacy=%v event %s:\n fast     %s\n executor %s", qi, legacy, e.subject, got, want)
				}
				var m map[string]any
				if err := json.Unmarshal(got, &m); err != nil {
					t.Errorf("query %d: next message is not JSON: %v: %s", qi, err, got)
				}
			}
		}
	}
}

// rawWSPair returns a server-side WebSocket (over the gateway's hijacked
// FrameWriter) whose peer reads and discards everything with a buffer it
// reuses, so allocation counts are the server's alone.
func rawWSPair(t testing.TB) (*websocket.Conn, *netconn.FrameWriter) {
	t.Helper()
	type accepted struct {
		ws *websocket.Conn
		fw *netconn.FrameWriter
	}
	got := make(chan accepted, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var fw *netconn.FrameWriter
		ws, err := websocket.Accept(netconn.HijackWriter{ResponseWriter: w, FW: &fw}, r, &websocket.AcceptOptions{CompressionMode: websocket.CompressionDisabled})
		if err != nil {
			t.Error(err)
			return
		}
		got <- accepted{ws, fw}
	}))
	t.Cleanup(srv.Close)
	nc, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	req := "GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
	if _, err := io.WriteString(nc, req); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(nc)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade: %v %v", resp, err)
	}
	done := make(chan struct{})
	go func() { // the peer: reads and discards until the socket closes
		defer close(done)
		buf := make([]byte, 64<<10)
		for {
			if _, err := br.Read(buf); err != nil {
				return
			}
		}
	}()
	a := <-got
	t.Cleanup(func() {
		_ = a.ws.CloseNow()
		_ = nc.Close()
		<-done
	})
	return a.ws, a.fw
}

// TestGraphQLDeliveryAllocs: on the fast path, a delivery — queued in the
// mailbox, taken by the writer, spliced into its next message and written
// (corked) to a real socket — allocates nothing.
func TestGraphQLDeliveryAllocs(t *testing.T) {
	s := newTestServer(t)
	ws, fw := rawWSPair(t)
	c := &conn{s: s, ws: ws, fw: fw, gql: &gqlConn{ops: make(map[string]*gqlOp)}}
	c.cl = fanout.NewClient(4096, 4<<20, func() { t.Error("overflow") })
	c.cl.Encode = c.gql.encode
	op := gqlOpFor(t, s, "1", false, `subscription { events(subject: "orders.>") { subject cursor data } }`, nil, false)
	if !op.fast {
		t.Fatal("not on the fast path")
	}
	c.gql.ops["1"] = op
	subs := c.cl.SubsFor([]string{"1"})
	ev, err := fanout.NewEvent("orders.42", "js:7", []byte(`{"id":42,"status":"paid","pad":"`+strings.Repeat("x", 200)+`"}`))
	if err != nil {
		t.Fatal(err)
	}
	gqlWriteAllocFree(t, c, ev, subs)
}

// gqlWriteAllocFree checks that writing ev to the GraphQL connection c,
// for subs, in batches of 64 allocates nothing once the pools and the
// cork buffer are warm.
func gqlWriteAllocFree(t *testing.T, c *conn, ev *fanout.Event, subs *fanout.SubsList) {
	t.Helper()
	const perRun = 64
	run := func() {
		for range perRun {
			it := fanout.Item{Ev: ev, Subs: subs}
			if _, _, err := c.cl.Mailbox.Push(it, it.Size()); err != nil {
				t.Fatal(err)
			}
		}
		b := c.cl.Mailbox.Take()
		if err := c.writeBatchGQL(&b); err != nil {
			t.Fatal(err)
		}
		b.Release()
	}
	for range 10 {
		run()
	}
	if a := ownAllocsPerRun(200, run); a/perRun > 0.01 {
		t.Errorf("%.2f allocations per %d deliveries, want 0", a, perRun)
	}
}

// BenchmarkDeliveryWrite compares the writer's cost per delivery of the
// native protocol (events coalesced into frames) and GraphQL (one message
// per event, corked into one write per batch), 256-byte events, batches of
// 64, to a real socket.
//
// native-flusher is the native protocol as a shared flusher writes it
// (conn_flush.go): framed by the gateway, written without blocking.
func BenchmarkDeliveryWrite(b *testing.B) {
	for _, proto := range []string{"native", "native-flusher", "graphql"} {
		b.Run("proto="+proto, func(b *testing.B) {
			s := newTestServer(b)
			ws, fw := rawWSPair(b)
			c := &conn{s: s, ws: ws, fw: fw}
			c.cl = fanout.NewClient(4096, 4<<20, func() { b.Error("overflow") })
			var subs *fanout.SubsList
			if proto == "graphql" {
				c.gql = &gqlConn{ops: make(map[string]*gqlOp)}
				c.cl.Encode = c.gql.encode
				c.gql.ops["1"] = gqlOpFor(b, s, "1", false, `subscription { events(subject: "bench.>") { subject cursor data } }`, nil, false)
			}
			subs = c.cl.SubsFor([]string{"1"})
			data := []byte(`{"seq":1,"pad":"` + strings.Repeat("x", 256-len(`{"seq":1,"pad":""}`)) + `"}`)
			ev, err := fanout.NewEvent("bench.hot", "", data)
			if err != nil {
				b.Fatal(err)
			}
			const batch = 64
			b.ReportAllocs()
			for b.Loop() {
				for range batch {
					it := fanout.Item{Ev: ev, Subs: subs}
					if _, _, err := c.cl.Mailbox.Push(it, it.Size()); err != nil {
						b.Fatal(err)
					}
				}
				if proto == "native-flusher" {
					flushBench(b, c)
					continue
				}
				bt := c.cl.Mailbox.Take()
				if err := c.writeBatch(&bt); err != nil {
					b.Fatal(err)
				}
				bt.Release()
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*batch), "ns/delivery")
		})
	}
}

// flushBench writes c's mailbox as a flusher's turn does; bytes the socket
// did not take are then written as the connection's own writer would.
func flushBench(tb testing.TB, c *conn) {
	switch c.flushNB() {
	case flushFailed:
		tb.Fatal("write failed")
	case flushHandOff:
		if err := c.fw.FlushPending(); err != nil {
			tb.Fatal(err)
		}
	}
}

// TestGraphQLExecutorResponseWithoutTheEvent: a response the executor gives
// without taking the event it was handed (gqlgen's one-shot error response,
// then nil, does) must not leave the writer blocked on the operation's
// channel at its next delivery: that would hang the connection's writer,
// and with it the node's shutdown.
func TestGraphQLExecutorResponseWithoutTheEvent(t *testing.T) {
	op := &gqlOp{
		id:   "1",
		next: graphql.OneShot(&graphql.Response{Errors: gqlerror.List{gqlerror.Errorf("boom")}}),
		ctx:  context.Background(),
		ch:   make(chan *schema.Event, 1),
		head: nextHead("1", false),
	}
	ev, err := fanout.NewEvent("orders.1", "", []byte(`{"n":1}`))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan []string, 1)
	go func() { // the writer's deliveries
		var out []string
		for range 3 {
			out = append(out, string(op.appendNext(nil, ev)))
		}
		done <- out
	}()
	select {
	case out := <-done:
		want := []string{`{"id":"1","type":"next","payload":{"errors":[{"message":"boom"}],"data":null}}`, "", ""}
		for i := range want {
			if out[i] != want[i] {
				t.Errorf("delivery %d: got %q, want %q", i, out[i], want[i])
			}
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the writer is blocked on the operation's channel after a response that did not take its event")
	}
}
