package gateway_test

import (
	"testing"
	"time"

	"github.com/fanwire/fanwire/gateway"
	"github.com/fanwire/fanwire/gateway/auth"
	"github.com/golang-jwt/jwt/v5"
)

// regionToken is a token for sub whose subscribe grant on orders.* is
// filtered to its own customer's rows and its region claim.
func regionToken(t *testing.T, sub, region string, exp time.Time, where string) string {
	t.Helper()
	return sign(t, jwt.SigningMethodHS256, []byte(testSecret), "", jwt.MapClaims{
		"sub": sub, "region": region, "exp": exp.Unix(),
		"subscribe": []any{map[string]any{"subject": "orders.*", "where": where}, "app.>"},
	})
}

const ownRows = "doc.customer == claims.sub && doc.region == claims.region"

// TestGrantRowFilter: a token's subscribe entry {"subject","where"} lets
// the connection see only the rows its filter accepts, with the token's
// claims as typed values; the subscription's own where is ANDed with it;
// live, resume and durable paths all apply it; a refresh that keeps the
// filter and the claims it reads keeps the subscriptions, one that changes
// them revokes them.
func TestGrantRowFilter(t *testing.T) {
	e := jwtEnv(t, "jetstream", auth.JWTConfig{}, func(c *gateway.Config) { c.AnonymousDurables = false })
	hour := time.Now().Add(time.Hour)
	cl := e.dialToken(regionToken(t, "c1", "eu", hour, ownRows))
	cl.keepSynced = true
	cl.subscribe("live", "orders.*")
	cl.send(`{"type":"subscribe","id":"big","subject":"orders.*","where":"doc.total > 10"}`)
	cl.expect(map[string]any{"type": "subscribed", "id": "big"})
	cl.subscribe("free", "app.>")

	first := e.store("orders.0", `{"doc":{"customer":"c1","region":"eu","total":1}}`)
	docs := []struct {
		subject, data string
		to            []any
	}{
		{"orders.1", `{"doc":{"customer":"c1","region":"eu","total":50}}`, []any{"big", "live"}},
		{"orders.2", `{"doc":{"customer":"c2","region":"eu","total":50}}`, nil},
		{"orders.3", `{"doc":{"customer":"c1","region":"us","total":50}}`, nil},
		{"orders.4", `{"doc":{"customer":"c1","region":"eu","total":5}}`, []any{"live"}},
		{"orders.5", `{"doc":{"customer":"x' || true || '","region":"eu","total":50}}`, nil},
		{"app.1", `{"doc":{"customer":"c2"}}`, []any{"free"}},
	}
	for _, d := range docs {
		e.store(d.subject, d.data)
	}
	cl.expect(map[string]any{"type": "event", "subject": "orders.0", "subs": []any{"live"}})
	for _, d := range docs {
		if d.to == nil {
			continue
		}
		if len(d.to) == 2 { // one frame per subscription of a view: order between them is free
			a := cl.expect(map[string]any{"type": "event", "subject": d.subject})
			b := cl.expect(map[string]any{"type": "event", "subject": d.subject})
			if got := []any{a["subs"].([]any)[0], b["subs"].([]any)[0]}; !(jsonEqual(got, d.to) || jsonEqual(got, []any{d.to[1], d.to[0]})) {
				t.Fatalf("%s went to %v, want %v", d.subject, got, d.to)
			}
			continue
		}
		cl.expect(map[string]any{"type": "event", "subject": d.subject, "subs": d.to})
	}
	cl.quiet()

	// Resume and durable: the same rows, never another customer's.
	again := e.dialToken(regionToken(t, "c1", "eu", hour, ownRows))
	again.send(`{"type":"subscribe","id":"r","subject":"orders.*","from":"` + first + `"}`)
	again.expect(map[string]any{"type": "subscribed", "id": "r"})
	again.expect(map[string]any{"type": "event", "subject": "orders.1"})
	again.expect(map[string]any{"type": "event", "subject": "orders.4"})
	again.send(`{"type":"subscribe","id":"d","subject":"orders.*","durable":"dd","from":"first"}`)
	again.expect(map[string]any{"type": "subscribed", "id": "d"})
	for _, s := range []string{"orders.0", "orders.1", "orders.4"} {
		again.expect(map[string]any{"type": "event", "subject": s, "subs": []any{"d"}})
	}
	again.quiet()

	// A refresh that keeps the filter and its claims (a new exp) keeps
	// the subscriptions; one whose region differs revokes the filtered
	// ones, in id order, and keeps the unfiltered one.
	cl.send(`{"type":"refresh","id":"r1","token":"` + regionToken(t, "c1", "eu", hour.Add(time.Minute), ownRows) + `"}`)
	cl.expect(map[string]any{"type": "refreshed", "id": "r1"})
	e.store("orders.6", `{"doc":{"customer":"c1","region":"eu","total":1}}`)
	cl.expect(map[string]any{"type": "event", "subject": "orders.6", "subs": []any{"live"}})
	cl.send(`{"type":"refresh","id":"r2","token":"` + regionToken(t, "c1", "us", hour.Add(2*time.Minute), ownRows) + `"}`)
	cl.expect(map[string]any{"type": "error", "id": "big", "code": "revoked"})
	cl.expect(map[string]any{"type": "error", "id": "live", "code": "revoked"})
	cl.expect(map[string]any{"type": "refreshed", "id": "r2"})
	e.store("orders.7", `{"doc":{"customer":"c1","region":"eu","total":100}}`)
	e.store("app.2", `{}`)
	cl.expect(map[string]any{"type": "event", "subject": "app.2", "subs": []any{"free"}})
	cl.quiet()
}

// TestGrantRowFilterRefusals: a token entry whose filter does not compile
// grants nothing (forbidden, naming the filter's error); an object entry
// with another key is dropped (forbidden: never widened to its pattern).
func TestGrantRowFilterRefusals(t *testing.T) {
	e := jwtEnv(t, "nats", auth.JWTConfig{}, nil)
	hour := time.Now().Add(time.Hour)
	cl := e.dialToken(regionToken(t, "c1", "eu", hour, "doc.customer =="))
	cl.send(`{"type":"subscribe","id":"a","subject":"orders.*"}`)
	m := cl.expect(map[string]any{"type": "error", "id": "a", "code": "forbidden"})
	if msg, _ := m["message"].(string); !contains(msg, "does not compile") {
		t.Fatalf("message %q", msg)
	}
	odd := e.dialToken(sign(t, jwt.SigningMethodHS256, []byte(testSecret), "", jwt.MapClaims{
		"sub": "c1", "exp": hour.Unix(),
		"subscribe": []any{map[string]any{"subject": "orders.*", "where": "true", "also": 1}},
	}))
	odd.send(`{"type":"subscribe","id":"a","subject":"orders.*"}`)
	odd.expect(map[string]any{"type": "error", "id": "a", "code": "forbidden"})
}
