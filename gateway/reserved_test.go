package gateway_test

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"

	"github.com/fanwire/fanwire/gateway"
	"github.com/golang-jwt/jwt/v5"
)

// The reserved-subject rule is not byte-exact: a subject that differs
// from a reserved one by case or by an invisible character is refused
// too, and a grant reaches the reserved space only by naming it before
// its claims are substituted.

// TestReservedSubjectsNormalised: case variants (ASCII, full-width) of a
// reserved subject are reserved; subjects with format, control or
// invisible characters, or that were not valid UTF-8, are refused for
// publish and subscribe.
func TestReservedSubjectsNormalised(t *testing.T) {
	e := newEnv(t, func(c *gateway.Config) {
		c.APIKeys = []gateway.APIKey{
			{Name: "admin", Key: "k-admin-0123456789"},
			{Name: "audit", Key: "k-audit-0123456789", Publish: []string{"db.audit.>", "app.*"}},
		}
	})
	for _, tc := range []struct {
		key, subject string
		status       int
		code, rule   string
	}{
		{"k-admin-0123456789", "DB.orders.1", 403, "forbidden", "reserved_subjects"},
		{"k-admin-0123456789", "Db.orders.1", 403, "forbidden", "reserved_subjects"},
		{"k-admin-0123456789", "\uff44\uff42.orders.1", 403, "forbidden", "reserved_subjects"}, // full-width "db"
		{"k-audit-0123456789", "DB.audit.1", 403, "forbidden", "reserved_subjects"},            // its pattern matches db.audit.1, not DB.audit.1
		{"k-admin-0123456789", "db\u200b.orders.1", 400, "bad_subject", "subject_syntax"},      // zero-width space
		{"k-admin-0123456789", "\u200bdb.orders.1", 400, "bad_subject", "subject_syntax"},
		{"k-admin-0123456789", "db.orders.1\u2060", 400, "bad_subject", "subject_syntax"}, // word joiner
		{"k-admin-0123456789", "d\u00adb.orders.1", 400, "bad_subject", "subject_syntax"}, // soft hyphen
		{"k-admin-0123456789", "db\u202e.x", 400, "bad_subject", "subject_syntax"},        // right-to-left override
		{"k-admin-0123456789", "db\ufeff.x", 400, "bad_subject", "subject_syntax"},        // byte order mark
		{"k-admin-0123456789", "db\u0085.x", 400, "bad_subject", "subject_syntax"},        // C1 control
		{"k-admin-0123456789", "db\u00a0.x", 400, "bad_subject", "subject_syntax"},        // no-break space
		{"k-admin-0123456789", "db\u2028.x", 400, "bad_subject", "subject_syntax"},        // line separator
		{"k-admin-0123456789", "db\ufffd.x", 400, "bad_subject", "subject_syntax"},        // what invalid UTF-8 decodes to
		{"k-admin-0123456789", "app.caf\u00e9", 200, "", ""},                              // letters are letters
		{"k-audit-0123456789", "db.audit.1", 200, "", ""},
	} {
		body, _ := json.Marshal(map[string]any{"subject": tc.subject, "data": map[string]any{}})
		r := e.postPublish(tc.key, string(body))
		if r.status != tc.status || r.Code != tc.code || r.Rule != tc.rule {
			t.Errorf("%s → %+q: %d %s, want %d %s %s", tc.key, tc.subject, r.status, r.raw, tc.status, tc.code, tc.rule)
		}
	}
	// A lone surrogate escape decodes to U+FFFD.
	if r := e.postPublish("k-admin-0123456789", `{"subject":"db\ud800.x","data":{}}`); r.status != 400 || r.Code != "bad_subject" {
		t.Errorf("lone surrogate: %d %s", r.status, r.raw)
	}
	cl := e.dial()
	for i, p := range []string{"db\u200b.>", "\u200b>", "app.\u2060*"} {
		b, _ := json.Marshal(map[string]any{"type": "subscribe", "id": "s" + strconv.Itoa(i), "subject": p})
		cl.send(string(b))
		if m := cl.next(); m["type"] != "error" || m["code"] != gateway.CodeBadPattern {
			t.Errorf("subscribe %+q: %v, want bad_pattern", p, m)
		}
	}
}

// TestReservedGrantNamedBeforeClaims: a token pattern whose first token
// is a {claim} placeholder does not name the reserved space, whatever the
// claim holds; one that names it (db.{tenant}.>) does.
func TestReservedGrantNamedBeforeClaims(t *testing.T) {
	e, token := publishTokens(t, nil)
	for _, tc := range []struct {
		name    string
		claims  jwt.MapClaims
		subject string
		status  int
		rule    string
	}{
		{"tenant db", jwt.MapClaims{"tenant": "db", "publish": []any{"{tenant}.orders.>"}}, "db.orders.1", 403, "reserved_subjects"},
		{"tenant db, >", jwt.MapClaims{"tenant": "db", "publish": []any{"{tenant}.>"}}, "db.orders.1", 403, "reserved_subjects"},
		{"tenant DB", jwt.MapClaims{"tenant": "DB", "publish": []any{"{tenant}.>"}}, "DB.orders.1", 403, "reserved_subjects"},
		{"tenant with a zero-width space", jwt.MapClaims{"tenant": "acme\u200b", "publish": []any{"chat.{tenant}.>"}}, "chat.acme\u200b.1", 400, "subject_syntax"},
		{"named", jwt.MapClaims{"tenant": "acme", "publish": []any{"db.{tenant}.>"}}, "db.acme.1", 200, ""},
		{"tenant elsewhere", jwt.MapClaims{"tenant": "acme", "publish": []any{"{tenant}.orders.>"}}, "acme.orders.1", 200, ""},
	} {
		body, _ := json.Marshal(map[string]any{"subject": tc.subject, "data": map[string]any{}})
		r := e.postPublish(token(tc.claims), string(body))
		if r.status != tc.status || r.Rule != tc.rule {
			t.Errorf("%s → %+q: %d %s, want %d %s", tc.name, tc.subject, r.status, r.raw, tc.status, tc.rule)
		}
		if tc.status == 403 && !strings.Contains(r.Error, "before") {
			t.Errorf("%s: refusal %q should say a grant names the reserved space before its claims are substituted", tc.name, r.Error)
		}
	}
}
