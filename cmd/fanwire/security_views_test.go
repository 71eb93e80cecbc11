package main

// The views attacks of issue 37: what one hostile client could do through
// live views, filters and presence, tried against a real `fanwire ws`
// process on JetStream in a nats-server process of its own, anonymous
// connections granted app.>. Each failed on the main before issue 37.

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fanwire/fanwire/broker/brokertest"
	"github.com/golang-jwt/jwt/v5"
)

// metric is the value of one series of the node's /metrics (name with its
// labels, as exposed: `fanwire_x{code="y"}`), 0 when absent.
func (n *secNode) metric(t testing.TB, series string) float64 {
	t.Helper()
	resp, err := secHTTP.Get("http://" + n.addr + "/metrics")
	if err != nil {
		t.Fatalf("/metrics: %v", err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("/metrics: %s: %v", sc.Text(), err)
			}
			return f
		}
	}
	return 0
}

// hostileWhere is the review's where: a regex whose RE2 program has 1.9
// million instructions, distinct per n.
func hostileWhere(n int) string {
	return `subject.matches('(?:` + strings.Repeat(".", 1900) + `){1000}') || subject == 'n` + strconv.Itoa(n) + `'`
}

func TestSecurityViews(t *testing.T) {
	t.Parallel() // a process-level test that mostly waits: beside the others (make test's time)
	bin := buildBinary(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	secretFile := filepath.Join(t.TempDir(), "jwt-secret")
	if err := os.WriteFile(secretFile, []byte(secSecret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	jsURL := brokertest.NATSBinary(t, brokertest.DebianNATS)
	node := startSecNode(t, bin, "--broker", "jetstream", "--nats-url", jsURL, "--subjects", "app.>,db.>",
		"--jwt-secret-file", secretFile, "--allow-anonymous", "--anonymous-grants", "app.>", "--allow-anonymous-publish")
	publish := func(t *testing.T, body string) {
		t.Helper()
		if code, resp := node.post(t, "/api/publish", "", body); code != http.StatusOK {
			t.Fatalf("publish %s: %d %s", body, code, resp)
		}
	}

	t.Run("ten hostile regex wheres are refused and cost no memory", func(t *testing.T) {
		c := node.dial(ctx, t, "")
		before := node.rss(t)
		for i := range 10 {
			w, _ := json.Marshal(hostileWhere(i))
			c.send(ctx, fmt.Sprintf(`{"type":"subscribe","id":"h%d","subject":"app.>","where":%s}`, i, w))
			msg := c.until(ctx, fmt.Sprintf(`"h%d"`, i))
			c.send(ctx, fmt.Sprintf(`{"type":"unsubscribe","id":"h%d"}`, i))
			if !strings.Contains(msg, `"bad_filter"`) {
				t.Errorf("a hostile where: %.200s", msg)
			}
		}
		if grew := node.rss(t) - before; grew > 50<<20 {
			t.Errorf("ten hostile wheres grew the node's RSS by %d MiB", grew>>20)
		}
		// The node still answers: a subscription, a publish, its event.
		c.send(ctx, `{"type":"subscribe","id":"ok","subject":"app.alive"}`)
		c.until(ctx, `"subscribed"`)
		publish(t, `{"subject":"app.alive","data":1}`)
		c.until(ctx, `"app.alive"`)
	})

	t.Run("100 connections with one where cost one evaluation per event", func(t *testing.T) {
		const conns, events = 100, 10
		var cs []*secConn
		for range conns {
			c := node.dial(ctx, t, "")
			c.send(ctx, `{"type":"subscribe","id":"v","subject":"app.orders.*","where":"doc.status == 'open' && doc.total > 10"}`)
			c.until(ctx, `"subscribed"`)
			cs = append(cs, c)
		}
		before := node.metric(t, "fanwire_filter_evaluations_total")
		for i := range events {
			publish(t, fmt.Sprintf(`{"subject":"app.orders.%d","data":{"doc":{"status":"open","total":20}}}`, i))
		}
		for _, c := range cs {
			c.until(ctx, fmt.Sprintf(`"app.orders.%d"`, events-1))
		}
		if got := node.metric(t, "fanwire_filter_evaluations_total") - before; got != events {
			t.Errorf("%d events to %d equal views: %v evaluations, want %d", events, conns, got, events)
		}
		for _, c := range cs {
			c.c.CloseNow()
		}
	})

	t.Run("a row-filtered grant gives no presence", func(t *testing.T) {
		agent := node.dial(ctx, t, secToken(t, jwt.MapClaims{"sub": "agent-9", "presence": []string{"app.orders.*"}, "subscribe": []string{"app.>"}}))
		agent.send(ctx, `{"type":"track","id":"t","subject":"app.orders.99","state":{"note":"refund for a VIP"}}`)
		agent.until(ctx, `"tracked"`)
		c1 := node.dial(ctx, t, secToken(t, jwt.MapClaims{"sub": "c1", "subscribe": []any{map[string]any{"subject": "app.orders.*", "where": "doc.customer_id == claims.sub"}}}))
		c1.send(ctx, `{"type":"members","id":"m","subject":"app.orders.99"}`)
		if msg := c1.until(ctx, `"m"`); !strings.Contains(msg, `"forbidden"`) || strings.Contains(msg, "agent-9") {
			t.Errorf("members on a filtered grant: %.300s", msg)
		}
		c1.send(ctx, `{"type":"subscribe","id":"w","subject":"app.orders.*","presence":true}`)
		if msg := c1.until(ctx, `"w"`); !strings.Contains(msg, `"forbidden"`) {
			t.Errorf("a presence watch on a filtered grant: %.300s", msg)
		}
	})

	t.Run("a publisher's truncate-shaped event drops nothing from a view", func(t *testing.T) {
		publish(t, `[{"subject":"app.shop.1","data":{"op":"insert","doc":{"customer_id":"c1","n":1}}},{"subject":"app.shop.2","data":{"op":"insert","doc":{"customer_id":"c2","n":2}}}]`)
		tok := secToken(t, jwt.MapClaims{"sub": "c1", "subscribe": []any{map[string]any{"subject": "app.shop.*", "where": "doc.customer_id == claims.sub"}}})
		v := node.dial(ctx, t, tok)
		v.send(ctx, `{"type":"subscribe","id":"v","subject":"app.shop.*","from":"latest"}`)
		v.until(ctx, `"synced"`)
		publish(t, `[{"subject":"app.shop.%truncate","data":{"op":"truncate"}},{"subject":"app.shop.3","data":{"op":"insert","doc":{"customer_id":"c1","n":3}}}]`)
		if msg := v.until(ctx, `"event"`); !strings.Contains(msg, `"app.shop.3"`) {
			t.Errorf("the view received %.200s before app.shop.3", msg)
		}
		// A later snapshot is whole: the forged truncate is not replayed.
		late := node.dial(ctx, t, tok)
		late.send(ctx, `{"type":"subscribe","id":"v","subject":"app.shop.*","from":"latest"}`)
		got := map[string]bool{}
		for {
			msg := late.until(ctx, `"v"`)
			if strings.Contains(msg, `"synced"`) {
				break
			}
			var m struct{ Type, Subject string }
			if json.Unmarshal([]byte(msg), &m) == nil && m.Type == "event" {
				got[m.Subject] = true
			}
		}
		if !got["app.shop.1"] || !got["app.shop.3"] || len(got) != 2 {
			t.Errorf("the snapshot after a forged truncate: %v, want app.shop.1 and app.shop.3", got)
		}
	})

	t.Run("one connection's costly filters end; another's delivery goes on", func(t *testing.T) {
		h := node.dial(ctx, t, "")
		h.c.SetReadLimit(1 << 20)
		for i := range 256 {
			w := fmt.Sprintf(`doc.xs.all(x, doc.xs.all(y, x + y >= %d))`, -i)
			for {
				h.send(ctx, fmt.Sprintf(`{"type":"subscribe","id":"h%d","subject":"app.cost.*","where":%q}`, i, w))
				msg := h.until(ctx, fmt.Sprintf(`"h%d"`, i))
				if strings.Contains(msg, `"rate_limited"`) {
					// --max-message-rate: tokens come back after a second.
					time.Sleep(1100 * time.Millisecond)
					continue
				}
				if !strings.Contains(msg, `"subscribed"`) {
					t.Fatalf("h%d: %.300s", i, msg)
				}
				break
			}
		}
		v := node.dial(ctx, t, "")
		v.send(ctx, `{"type":"subscribe","id":"v","subject":"app.cost.*","where":"doc.n >= 0"}`)
		v.until(ctx, `"subscribed"`)
		xs := strings.TrimSuffix(strings.Repeat("1,", 300), ",")
		before := node.metric(t, "fanwire_filter_cost_units_total")
		for n := range 20 {
			publish(t, fmt.Sprintf(`{"subject":"app.cost.%d","data":{"doc":{"n":%d,"xs":[%s]}}}`, n, n, xs))
		}
		for n := range 20 {
			v.until(ctx, fmt.Sprintf(`"app.cost.%d"`, n))
		}
		// 20 events × at most two 10,000-unit evaluations of h (plus v's):
		// before, every one of the 256 ran to its limit on every event.
		if spent := node.metric(t, "fanwire_filter_cost_units_total") - before; spent > 20*(2*10_000+1_000)+10_000 {
			t.Errorf("the dispatcher spent %.0f cost units on 20 events", spent)
		}
		if got := node.metric(t, `fanwire_client_errors_total{code="filter_too_costly"}`); got < 250 {
			t.Errorf("filter_too_costly errors: %v, want the connection's filters past its share to end", got)
		}
	})

	t.Run("a snapshot over a broad pattern is refused before the broker's index is read (Redis)", func(t *testing.T) {
		r := brokertest.StartRedis(t, t.TempDir(), 0)
		rn := startSecNode(t, bin, "--broker", "redis", "--redis-url", "redis://"+r.Addr(), "--allow-anonymous",
			"--anonymous-grants", "app.>", "--allow-anonymous-publish", "--max-snapshot", "100")
		var batch strings.Builder
		for i := range 1_100 {
			if i%100 == 0 {
				if batch.Len() > 0 {
					batch.WriteString("]")
					if code, body := rn.post(t, "/api/publish", "", batch.String()); code != http.StatusOK {
						t.Fatalf("publish: %d %s", code, body)
					}
				}
				batch.Reset()
				batch.WriteString("[")
			} else {
				batch.WriteString(",")
			}
			fmt.Fprintf(&batch, `{"subject":"app.rows.%d","data":{"doc":{"n":%d}}}`, i, i)
		}
		batch.WriteString("]")
		if code, body := rn.post(t, "/api/publish", "", batch.String()); code != http.StatusOK {
			t.Fatalf("publish: %d %s", code, body)
		}
		c := rn.dial(ctx, t, "")
		c.c.SetReadLimit(16 << 20)
		c.send(ctx, `{"type":"subscribe","id":"all","subject":"app.rows.*","from":"latest"}`)
		if msg := c.until(ctx, `"error"`); !strings.Contains(msg, `"view_too_large"`) {
			t.Errorf("an unfiltered snapshot of 1,100 subjects past --max-snapshot 100: %.300s", msg)
		}
		// A where passing one row: the broker reads at most ten times
		// --max-snapshot subjects for it.
		c.send(ctx, `{"type":"subscribe","id":"one","subject":"app.rows.*","where":"doc.n == 7","from":"latest"}`)
		if msg := c.until(ctx, `"error"`); !strings.Contains(msg, `"view_too_large"`) || !strings.Contains(msg, "stored subjects") {
			t.Errorf("a filtered snapshot of 1,100 subjects: %.300s", msg)
		}
	})
}
