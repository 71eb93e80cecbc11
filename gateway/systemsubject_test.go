package gateway_test

import (
	"strconv"
	"strings"
	"testing"

	"github.com/fanwire/fanwire/gateway"
)

// System subjects (a first token starting with '$', or _INBOX) are the
// NATS server's APIs and replies: closed to publishers and subscribers,
// and never delivered to a wildcard pattern.

var systemSubjects = []string{"$JS.API.STREAM.DELETE.ORDERS", "$KV.config.k", "_INBOX.abc.def", "$SYS.REQ.SERVER.PING"}

// TestSystemSubjectsClosed: with the default subject space (>), no key
// (even one publishing anywhere) publishes to a system subject over HTTP,
// the native protocol or GraphQL, no connection subscribes to one, and
// subscriptions to > and *.> never get the system traffic that reaches the
// gateway's broker subscription.
func TestSystemSubjectsClosed(t *testing.T) {
	e := newEnv(t, func(c *gateway.Config) {
		c.APIKeys = []gateway.APIKey{
			{Name: "admin", Key: "k-admin-0123456789"},
			{Name: "wide", Key: "k-wide-0123456789", Publish: []string{">"}},
		}
		c.AllowAnonymousPublish = true
	})
	watcher := e.dial()
	watcher.subscribe("all", ">")
	watcher.subscribe("two", "*.>")
	for _, s := range systemSubjects {
		for _, key := range []string{"k-admin-0123456789", "k-wide-0123456789"} {
			r := e.postPublish(key, `{"subject":"`+s+`","data":{}}`)
			if r.status != 403 || r.Code != gateway.CodeForbidden || r.Rule != "system_subjects" || !strings.Contains(r.Error, "--allow-system-subjects") || r.Subj != s {
				t.Errorf("POST %s with %s: %d %s, want 403 forbidden system_subjects", s, key, r.status, r.raw)
			}
		}
		cl := e.dial()
		if m := cl.publishWS("p", s, `{}`); m["type"] != "error" || m["code"] != gateway.CodeForbidden || !strings.Contains(m["message"].(string), "--allow-system-subjects") {
			t.Errorf("native publish to %s: %v, want forbidden naming --allow-system-subjects", s, m)
		}
		if ext := gqlFirstError(e.postGraphQL("k-admin-0123456789", `mutation { publish(subject: "`+s+`", data: {}) { subject } }`)); ext["code"] != gateway.CodeForbidden || ext["rule"] != "system_subjects" {
			t.Errorf("GraphQL publish to %s: %v, want forbidden system_subjects", s, ext)
		}
		first, _, _ := strings.Cut(s, ".")
		for i, p := range []string{first + ".>", s, first + ".*.>"} {
			cl.send(`{"type":"subscribe","id":"s` + strconv.Itoa(i) + `","subject":"` + p + `"}`)
			if m := cl.next(); m["type"] != "error" || m["code"] != gateway.CodeForbidden || !strings.Contains(m["message"].(string), "--allow-system-subjects") {
				t.Errorf("subscribe %s: %v, want forbidden naming --allow-system-subjects", p, m)
			}
		}
	}

	// System traffic on the broker: the broker subscription (>) gets it,
	// no client does.
	for _, s := range systemSubjects {
		e.publish(s, `{"system":true}`)
	}
	e.publish("app.1", `{}`)
	var got []string
	for m := watcher.next(); m["subject"] != "app.1"; m = watcher.next() {
		got = append(got, m["subject"].(string))
	}
	if len(got) > 0 {
		t.Errorf("> and *.> got system subjects %v", got)
	}
	watcher.quiet()
	if n := e.metric("fanwire_events_dropped_total", map[string]string{"reason": "system_subject"}); n < float64(len(systemSubjects)) {
		t.Errorf("system subjects dropped: %v, want at least %d", n, len(systemSubjects))
	}
	g := e.initGQL()
	g.gqlSubscribe("g1", "$JS.>", nil)
	if m := g.next(); m["type"] != "error" || !strings.Contains(m["payload"].([]any)[0].(map[string]any)["message"].(string), "--allow-system-subjects") {
		t.Errorf("GraphQL events on $JS.>: %v, want an error naming --allow-system-subjects", m)
	}
}

// TestAllowSystemSubjects: --allow-system-subjects opens named system
// subjects: a publish pattern and a subscription that name them reach
// them; wildcards (a key without patterns, a subscription to >) still
// do not, nor a pattern wider than the one opened.
func TestAllowSystemSubjects(t *testing.T) {
	e := newEnv(t, func(c *gateway.Config) {
		c.AllowSystemSubjects = []string{"$KV.config.>"}
		c.APIKeys = []gateway.APIKey{
			{Name: "admin", Key: "k-admin-0123456789"},
			{Name: "kv", Key: "k-kv-0123456789", Publish: []string{"$KV.config.>"}},
		}
	})
	watcher := e.dial()
	watcher.subscribe("all", ">")
	kv := e.dial()
	kv.subscribe("kv", "$KV.config.>")
	for _, p := range []string{"$KV.>", "$KV.*.>", "$JS.>"} {
		kv.send(`{"type":"subscribe","id":"x","subject":"` + p + `"}`)
		if m := kv.next(); m["type"] != "error" || m["code"] != gateway.CodeForbidden {
			t.Errorf("subscribe %s: %v, want forbidden", p, m)
		}
	}
	if r := e.postPublish("k-kv-0123456789", `{"subject":"$KV.config.a","data":{"v":1}}`); r.status != 200 {
		t.Fatalf("publish inside the opened pattern: %d %s", r.status, r.raw)
	}
	for _, tc := range []struct{ key, subject string }{
		{"k-admin-0123456789", "$KV.config.b"}, // no pattern names it
		{"k-kv-0123456789", "$KV.other.b"},     // not opened
	} {
		if r := e.postPublish(tc.key, `{"subject":"`+tc.subject+`","data":{}}`); r.status != 403 || r.Rule != "system_subjects" {
			t.Errorf("%s → %s: %d %s, want 403 system_subjects", tc.key, tc.subject, r.status, r.raw)
		}
	}
	e.publish("$KV.other.c", `{}`)
	e.publish("app.1", `{}`)
	kv.expect(map[string]any{"type": "event", "subject": "$KV.config.a", "subs": []string{"kv"}})
	watcher.expect(map[string]any{"type": "event", "subject": "app.1"})
	watcher.quiet()
	kv.quiet()

	for _, bad := range []string{">", "*.>", "app.>", "$KV..x"} {
		_, err := gateway.New(gateway.Config{Broker: e.b, AllowSystemSubjects: []string{bad}})
		if err == nil || !strings.Contains(err.Error(), "AllowSystemSubjects[0]") {
			t.Errorf("AllowSystemSubjects %q: %v, want an error naming the field", bad, err)
		}
	}
}
