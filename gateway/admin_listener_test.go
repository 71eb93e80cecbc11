package gateway_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/fanwire/fanwire/gateway"
)

// startAdminApart starts a gateway with the inspector apart, and its own
// HTTP server (AdminHTTPServer) in front of AdminHandler; it returns the
// gateway and the admin server's base URL.
func startAdminApart(t *testing.T) (*env, string) {
	t.Helper()
	e := newEnv(t, func(c *gateway.Config) { c.AdminKey = testAdminKey; c.AdminApart = true })
	as := httptest.NewUnstartedServer(nil)
	as.Config = e.srv.AdminHTTPServer()
	as.Start()
	t.Cleanup(as.Close)
	return e, as.URL
}

// httpDo sends a request to url with the admin key ("" none) and returns
// the status, the body and the headers.
func httpDo(t *testing.T, method, url, key, body string) (int, string, http.Header) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b), resp.Header
}

// TestAdminApart: with AdminApart the inspector answers on its own
// listener only. The client listener answers /admin/ 404, with the body
// of a node without a key (it does not tell that an inspector runs
// elsewhere); the admin listener serves the API (401 without the key),
// the console's page in its inspector mode at /, and nothing of the
// client listener's.
func TestAdminApart(t *testing.T) {
	e, admin := startAdminApart(t)
	plain := newEnv(t, nil) // no key at all

	c := e.dial()
	c.subscribe("s", "orders.*")

	for _, r := range []struct{ method, path string }{{"GET", "/admin/connections"}, {"POST", "/admin/connections/close"}, {"GET", "/admin/"}} {
		st, body, _ := httpDo(t, r.method, e.http.URL+r.path, testAdminKey, `{"id":"`+c.id+`","code":4000}`)
		_, without, _ := httpDo(t, r.method, plain.http.URL+r.path, testAdminKey, `{"id":"`+c.id+`","code":4000}`)
		if st != http.StatusNotFound || body != without || !strings.Contains(body, `"code":"not_found"`) {
			t.Fatalf("client listener %s %s with the key: %d %s, want 404 as without a key (%s)", r.method, r.path, st, body, without)
		}
	}
	if st, _, _ := httpDo(t, "GET", admin+"/admin/connections", "", ""); st != http.StatusUnauthorized {
		t.Fatalf("admin listener without the key: %d, want 401", st)
	}
	if st, _, _ := httpDo(t, "GET", admin+"/admin/connections", testAdminKey[:len(testAdminKey)-1], ""); st != http.StatusUnauthorized {
		t.Fatalf("admin listener with a wrong key: %d, want 401", st)
	}
	if got := e.metric("fanwire_admin_refused_total", nil); got != 2 {
		t.Fatalf("fanwire_admin_refused_total = %v, want 2", got)
	}
	st, body, _ := httpDo(t, "GET", admin+"/admin/connections", testAdminKey, "")
	if st != http.StatusOK || !strings.Contains(body, `"id":"`+c.id+`"`) || !strings.Contains(body, `"pattern":"orders.*"`) {
		t.Fatalf("admin listener: %d %s, want the client listener's connection listed", st, body)
	}
	if st, body, _ := httpDo(t, "POST", admin+"/admin/connections/close", testAdminKey, `{"id":"`+c.id+`","code":4000,"reason":"apart"}`); st != http.StatusOK || !strings.Contains(body, `"closed":1`) {
		t.Fatalf("admin listener close: %d %s", st, body)
	}
	if got := c.closeStatus(5 * time.Second); got != 4000 {
		t.Fatalf("closed through the admin listener with %d, want 4000", got)
	}

	st, page, h := httpDo(t, "GET", admin+"/", "", "")
	if st != http.StatusOK || !strings.HasPrefix(h.Get("Content-Type"), "text/html") || !strings.Contains(page, `<body data-page="inspector">`) || h.Get("X-Frame-Options") != "DENY" {
		t.Fatalf("admin listener /: %d %q, X-Frame-Options %q, want the console marked as the inspector's page, not framable", st, h.Get("Content-Type"), h.Get("X-Frame-Options"))
	}
	for _, path := range []string{"/ws", "/graphql", "/api/publish", "/healthz", "/readyz", "/metrics", "/fanwire.js", "/index.html"} {
		if st, _, _ := httpDo(t, "GET", admin+path, testAdminKey, ""); st != http.StatusNotFound {
			t.Errorf("admin listener GET %s: %d, want 404: it serves the inspector only", path, st)
		}
	}
	// The client listener's console is the live one, unmarked.
	if _, page, _ := httpDo(t, "GET", e.http.URL+"/", "", ""); !strings.Contains(page, "<body>") || strings.Contains(page, `<body data-page="inspector">`) {
		t.Fatal("the client listener's console is marked as the inspector's page")
	}
}

// TestAdminHandlerNotApart: without AdminApart, AdminHandler serves
// nothing, and AdminApart needs a key.
func TestAdminHandlerNotApart(t *testing.T) {
	e := newEnv(t, func(c *gateway.Config) { c.AdminKey = testAdminKey })
	as := httptest.NewServer(e.srv.AdminHandler())
	t.Cleanup(as.Close)
	for _, path := range []string{"/", "/admin/connections"} {
		if st, _, _ := httpDo(t, "GET", as.URL+path, testAdminKey, ""); st != http.StatusNotFound {
			t.Fatalf("GET %s: %d, want 404", path, st)
		}
	}
	if st, _, _ := httpDo(t, "GET", e.http.URL+"/admin/connections", testAdminKey, ""); st != http.StatusOK {
		t.Fatalf("client listener: %d, want the inspector there", st)
	}
	if _, err := gateway.New(gateway.Config{Broker: e.b, AdminApart: true}); err == nil || !strings.Contains(err.Error(), "AdminApart needs AdminKey") {
		t.Fatalf("AdminApart without a key: %v", err)
	}
}
