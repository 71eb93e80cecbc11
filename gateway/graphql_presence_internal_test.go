package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/99designs/gqlgen/graphql"
	"github.com/fanwire/fanwire/gateway/internal/fanout"
	"github.com/fanwire/fanwire/gateway/internal/presence"
)

// presenceOpFor builds the op a connection would for a presence
// subscription query, as gqlOpFor does for events.
func presenceOpFor(t testing.TB, s *Server, id string, legacy bool, query string, vars map[string]any, executorOnly bool) *gqlOp {
	t.Helper()
	ctx := graphql.StartOperationTrace(context.Background())
	opCtx, errs := s.gqlExec.CreateOperationContext(ctx, &graphql.RawParams{Query: query, Variables: vars})
	if errs != nil {
		t.Fatalf("%s: %v", query, errs)
	}
	root := graphql.CollectFields(opCtx, opCtx.Operation.SelectionSet, []string{"Subscription"})
	if len(root) != 1 || root[0].Name != "presence" {
		t.Fatalf("%s: not one presence field", query)
	}
	return s.newPresenceOp(ctx, id, legacy, opCtx, root[0], executorOnly)
}

// testPresenceEvent is a presence change as deliverLocked builds it for
// GraphQL watchers.
func testPresenceEvent(subject string, count int, changes []presence.Change) *fanout.Event {
	ev := presence.NewEvent(subject, count, changes)
	ev.Ext = newPresParts(count, changes)
	return ev
}

// TestGraphQLPresenceFastPathMatchesExecutor: for every selection of
// PresenceChange and Member the splice path serves, its next message is
// byte for byte what gqlgen's executor produces for the same change, and
// nextLen is its length.
func TestGraphQLPresenceFastPathMatchesExecutor(t *testing.T) {
	s := newTestServer(t)
	queries := []struct {
		q    string
		vars map[string]any
	}{
		{q: `subscription { presence(subject: "room.*") { subject count joins { conn sub state } leaves { conn sub state } updates { conn sub state } } }`},
		{q: `subscription { presence(subject: "room.*") { count } }`},
		{q: `subscription { p: presence(subject: "room.*") { __typename n: count s: subject j: joins { __typename c: conn st: state } l: leaves { conn } } }`},
		{q: `subscription { presence(subject: "room.*") { updates { state state conn } joins { ...M } } } fragment M on Member { sub conn }`},
		{q: `subscription($on: Boolean!) { presence(subject: "room.*") { count @skip(if: $on) joins { conn sub @include(if: $on) } } }`, vars: map[string]any{"on": true}},
		{q: `subscription($on: Boolean!) { presence(subject: "room.*") { count @skip(if: $on) joins { conn sub @include(if: $on) } } }`, vars: map[string]any{"on": false}},
	}
	join := func(conn, sub, state string) presence.Change {
		return presence.Change{Op: presence.OpJoin, Enc: presence.MemberJSON(conn, sub, []byte(state), false)}
	}
	changes := [][]presence.Change{
		{join("c1", "", "null")},
		{join("c1", "u1", `{"name":"ann","html":"<a href='x'>&amp;</a>"}`), join(`c"2\`, "ü \" \\ \u2028", `[1,2.5e3,null,true,"x"]`)},
		{{Op: presence.OpLeave, Enc: presence.MemberJSON("c3", "u3", nil, true)}, {Op: presence.OpLeave, Enc: presence.MemberJSON("c4", "", nil, true)}},
		{{Op: presence.OpUpdate, Enc: presence.MemberJSON("c5", "", []byte(`"typing"`), false)}, join("c6", "s", `{"pad":"`+strings.Repeat("x", 3000)+`"}`), {Op: presence.OpLeave, Enc: presence.MemberJSON("c7", "s", nil, true)}},
		{},
	}
	for qi, q := range queries {
		for _, legacy := range []bool{false, true} {
			fast := presenceOpFor(t, s, fmt.Sprint("op-", qi), legacy, q.q, q.vars, false)
			exec := presenceOpFor(t, s, fmt.Sprint("op-", qi), legacy, q.q, q.vars, true)
			if !fast.fast || exec.fast {
				t.Fatalf("query %d: fast %v, executor-only fast %v", qi, fast.fast, exec.fast)
			}
			for ci, ch := range changes {
				ev := testPresenceEvent("room.\"1\\", len(ch)+7, ch)
				got := fast.appendNext(nil, ev)
				want := exec.appendNext(nil, ev)
				if n := fast.nextLen(ev); n != len(got) {
					t.Errorf("query %d change %d: nextLen %d, message %d bytes", qi, ci, n, len(got))
				}
				if !bytes.Equal(got, want) {
					t.Errorf("query %d legacy=%v change %d:\n splice   %s\n executor %s", qi, legacy, ci, got, want)
				}
				if !json.Valid(got) {
					t.Errorf("query %d: next message is not JSON: %s", qi, got)
				}
			}
		}
	}
}

// TestGraphQLPresenceDeliveryAllocs: a presence change written to a
// GraphQL connection on the splice path allocates nothing per delivery.
func TestGraphQLPresenceDeliveryAllocs(t *testing.T) {
	s := newTestServer(t)
	c, subs := presenceBenchConn(t, s)
	gqlWriteAllocFree(t, c, benchPresenceEvent(), subs)
}

func presenceBenchConn(tb testing.TB, s *Server) (*conn, *fanout.SubsList) {
	ws, fw := rawWSPair(tb)
	c := &conn{s: s, ws: ws, fw: fw, gql: &gqlConn{ops: make(map[string]*gqlOp)}}
	c.cl = fanout.NewClient(4096, 4<<20, func() { tb.Error("overflow") })
	c.cl.Encode = c.gql.encode
	op := presenceOpFor(tb, s, "1", false, `subscription { presence(subject: "room.*") { subject count joins { conn sub state } leaves { conn sub state } updates { conn sub state } } }`, nil, false)
	if !op.fast {
		tb.Fatal("not on the splice path")
	}
	c.gql.ops["1"] = op
	return c, c.cl.SubsFor([]string{"1"})
}

// benchPresenceEvent is a typical small-room change: one join with a
// small state, one leave.
func benchPresenceEvent() *fanout.Event {
	return testPresenceEvent("room.42", 12, []presence.Change{
		{Op: presence.OpJoin, Enc: presence.MemberJSON("0123456789abcdef", "user-17", []byte(`{"name":"Ann","status":"online"}`), false)},
		{Op: presence.OpLeave, Enc: presence.MemberJSON("fedcba9876543210", "user-4", nil, true)},
	})
}

// BenchmarkPresenceDelivery: the writer's cost per presence change
// delivered to a GraphQL connection (splice path, batches of 64, to a real
// socket), and the once-per-change cost of its GraphQL values (parts).
func BenchmarkPresenceDelivery(b *testing.B) {
	b.Run("write", func(b *testing.B) {
		s := newTestServer(b)
		c, subs := presenceBenchConn(b, s)
		ev := benchPresenceEvent()
		const batch = 64
		b.ReportAllocs()
		for b.Loop() {
			for range batch {
				it := fanout.Item{Ev: ev, Subs: subs}
				if _, _, err := c.cl.Mailbox.Push(it, it.Size()); err != nil {
					b.Fatal(err)
				}
			}
			bt := c.cl.Mailbox.Take()
			if err := c.writeBatchGQL(&bt); err != nil {
				b.Fatal(err)
			}
			bt.Release()
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*batch), "ns/delivery")
	})
	b.Run("parts", func(b *testing.B) {
		changes := []presence.Change{
			{Op: presence.OpJoin, Enc: presence.MemberJSON("0123456789abcdef", "user-17", []byte(`{"name":"Ann","status":"online"}`), false)},
			{Op: presence.OpLeave, Enc: presence.MemberJSON("fedcba9876543210", "user-4", nil, true)},
		}
		b.ReportAllocs()
		for b.Loop() {
			_ = newPresParts(12, changes)
		}
	})
}
