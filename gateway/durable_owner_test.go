package gateway_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/fanwire/fanwire/broker"
	"github.com/fanwire/fanwire/broker/brokertest"
	"github.com/fanwire/fanwire/gateway"
	"github.com/fanwire/fanwire/gateway/auth"
)

// TestDurablesArePerPrincipal: a durable's name is the client's within its
// token's sub. Two subs naming the same durable get two consumers: one can
// neither bind, move, delete nor learn anything of the other's (the old
// global names let bob bind alice's "inbox", and its error named alice's
// filter). Anonymous connections get no durables unless AnonymousDurables;
// nor do tokens without a sub.
func TestDurablesArePerPrincipal(t *testing.T) {
	e := jwtEnv(t, "jetstream", auth.JWTConfig{AllowAnonymous: true, AnonymousGrants: []string{"orders.>", "app.>"}}, nil)
	hour := time.Now().Add(time.Hour)
	alice := e.dialToken(hsToken(t, "alice", hour, "orders.>", "app.>"))
	alice.send(`{"type":"subscribe","id":"a","subject":"orders.*","durable":"inbox"}`)
	alice.expect(map[string]any{"type": "subscribed", "id": "a"})
	e.publishN("orders.x", 1, 3)
	for i := 1; i <= 3; i++ {
		alice.expect(map[string]any{"type": "event", "data": i})
	}
	_ = alice.c.CloseNow()
	waitFor(t, "alice's connection to end", func() bool { return e.metric("fanwire_connections", nil) == 0 })

	// Bob's "inbox" is his own, on another pattern, from another cursor.
	bob := e.dialToken(hsToken(t, "bob", hour, "orders.>", "app.>"))
	bob.send(`{"type":"subscribe","id":"b","subject":"app.*","durable":"inbox","from":"first"}`)
	if m, raw := bob.pop(); m["type"] != "subscribed" || strings.Contains(raw, "orders") {
		t.Fatalf("bob's inbox: %s, want subscribed, and nothing of alice's", raw)
	}
	names := e.consumers()
	if len(names) != 2 || names[0] == names[1] {
		t.Fatalf("consumers %v, want alice's inbox and bob's", names)
	}
	for _, n := range names {
		if n == broker.DurablePrefix+"inbox" || !strings.HasPrefix(n, broker.DurablePrefix) || !strings.HasSuffix(n, "_inbox") {
			t.Fatalf("consumer %q: want %s<principal>_inbox", n, broker.DurablePrefix)
		}
	}
	// Alice comes back to hers where she left it: bob moved nothing.
	e.publishN("orders.x", 4, 1)
	e.publishN("app.x", 5, 1)
	alice = e.dialToken(hsToken(t, "alice", hour, "orders.>", "app.>"))
	alice.send(`{"type":"subscribe","id":"a","subject":"orders.*","durable":"inbox"}`)
	alice.expect(map[string]any{"type": "subscribed", "id": "a", "cursor": "js:3"})
	alice.expect(map[string]any{"type": "event", "data": 4, "subs": []any{"a"}})
	bob.expect(map[string]any{"type": "event", "data": 5, "subs": []any{"b"}})
	// Bob deletes his; alice's stays.
	bob.send(`{"type":"unsubscribe","id":"b"}`)
	bob.expect(map[string]any{"type": "unsubscribed", "id": "b"})
	if got := e.consumers(); len(got) != 1 {
		t.Fatalf("after bob unsubscribed: %v, want alice's inbox", got)
	}
	alice.quiet()
	bob.quiet()

	for _, tc := range []struct{ name, token, want string }{
		{"anonymous", "", "--anonymous-durables"},
		{"no sub", hsToken(t, "", hour, "orders.>"), `"sub"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cl := e.dialToken(tc.token)
			cl.send(`{"type":"subscribe","id":"d","subject":"orders.*","durable":"inbox"}`)
			m := cl.expect(map[string]any{"type": "error", "id": "d", "code": gateway.CodeBadDurable})
			if msg, _ := m["message"].(string); !strings.Contains(msg, tc.want) {
				t.Fatalf("message %q, want it to name %s", msg, tc.want)
			}
		})
	}
	t.Run("anonymous durables", func(t *testing.T) {
		e2 := e.sibling(func(c *gateway.Config) {
			c.Subjects = []string{"orders.>", "app.>"}
			c.Authenticate = e.srvAuth(t)
			c.AnonymousDurables = true
		})
		cl := e2.dialToken("")
		cl.send(`{"type":"subscribe","id":"d","subject":"app.*","durable":"inbox"}`)
		cl.expect(map[string]any{"type": "subscribed", "id": "d"})
		if got := e.consumers(); len(got) != 2 {
			t.Fatalf("consumers %v, want alice's inbox and the anonymous one", got)
		}
	})
}

// srvAuth is a JWTAuth like jwtEnv's, with anonymous connections.
func (e *env) srvAuth(t *testing.T) auth.Authenticator {
	a, err := auth.NewJWTAuth(auth.JWTConfig{SecretFile: writeFile(t, "secret", testSecret), AllowAnonymous: true, AnonymousGrants: []string{"orders.>", "app.>"}})
	if err != nil {
		t.Fatal(err)
	}
	return a.Grant
}

// TestMaxDurablesPerPrincipal: a principal may keep MaxDurables durables on
// the broker. A new one past it is refused (too_many_durables, naming the
// cap and its flag, counted); binding one of its own is always fine; the
// count is the broker's, so it holds across nodes, and a consumer the
// broker deleted (unsubscribed, expired) frees its slot. Another
// principal's durables do not count.
func TestMaxDurablesPerPrincipal(t *testing.T) {
	e := jwtEnv(t, "jetstream", auth.JWTConfig{}, func(c *gateway.Config) { c.MaxDurables = 2 })
	hour := time.Now().Add(time.Hour)
	aliceTok := hsToken(t, "alice", hour, "orders.>", "app.>")
	alice := e.dialToken(aliceTok)
	durable := func(cl *client, id, name string) map[string]any {
		cl.send(`{"type":"subscribe","id":"` + id + `","subject":"orders.*","durable":"` + name + `"}`)
		return cl.next()
	}
	for _, d := range []string{"d1", "d2"} {
		if m := durable(alice, d, d); m["type"] != "subscribed" {
			t.Fatalf("durable %s: %v", d, m)
		}
	}
	m := durable(alice, "d3", "d3")
	if msg, _ := m["message"].(string); m["code"] != gateway.CodeTooManyDurables || m["id"] != "d3" || !strings.Contains(msg, "--max-durables") || !strings.Contains(msg, "2") {
		t.Fatalf("a third durable: %v, want too_many_durables naming --max-durables 2", m)
	}
	if got := e.metric("fanwire_client_errors_total", map[string]string{"code": gateway.CodeTooManyDurables}); got != 1 {
		t.Fatalf("refusals counted %v, want 1", got)
	}
	bob := e.dialToken(hsToken(t, "bob", hour, "orders.>"))
	if m := durable(bob, "d3", "d3"); m["type"] != "subscribed" {
		t.Fatalf("bob's first durable: %v", m)
	}
	_ = alice.c.CloseNow()
	waitFor(t, "alice's connection to end", func() bool { return e.metric("fanwire_connections", nil) == 1 })

	// On another node: her own durables bind, a new one is refused.
	n2 := e.sibling(func(c *gateway.Config) {
		c.Subjects = []string{"orders.>", "app.>"}
		c.Authenticate = e.srvAuth(t)
		c.MaxDurables = 2
	})
	alice = n2.dialToken(aliceTok)
	if m := durable(alice, "d1", "d1"); m["type"] != "subscribed" {
		t.Fatalf("binding her own d1 at the cap: %v", m)
	}
	if m := durable(alice, "d3", "d3"); m["code"] != gateway.CodeTooManyDurables {
		t.Fatalf("a third durable on another node: %v, want too_many_durables", m)
	}
	// The broker drops d2 (as when it expires): a slot is free.
	js := brokertest.JetStream(t, e.ns.ClientURL())
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, n := range e.consumers() {
		if strings.HasSuffix(n, "_d2") {
			if err := js.DeleteConsumer(ctx, "FANWIRE", n); err != nil {
				t.Fatal(err)
			}
		}
	}
	if m := durable(alice, "d3", "d3"); m["type"] != "subscribed" {
		t.Fatalf("a durable after one expired: %v", m)
	}
	// Unsubscribing deletes one: a slot again.
	alice.send(`{"type":"unsubscribe","id":"d1"}`)
	alice.expect(map[string]any{"type": "unsubscribed", "id": "d1"})
	if m := durable(alice, "d4", "d4"); m["type"] != "subscribed" {
		t.Fatalf("a durable after unsubscribing one: %v", m)
	}
	if got := len(e.consumers()); got != 3 {
		t.Fatalf("%d consumers, want alice's 2 and bob's 1", got)
	}
}
