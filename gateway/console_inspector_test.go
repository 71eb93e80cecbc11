package gateway_test

import (
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/fanwire/fanwire/gateway"
	"github.com/fanwire/fanwire/gateway/auth"
	"github.com/fanwire/fanwire/gateway/browsertest"
)

// TestConsoleInspector: the console's Inspector in headless Chromium, on a
// gateway with an admin key and token authentication. A wrong key is
// refused and shows nothing; the right one lists the connections with
// their subs and subscriptions, filters them by sub, and closes one with
// the chosen code, which the client sees. The key stays in the page's
// memory: not in the field, the page's markup or storage.
func TestConsoleInspector(t *testing.T) {
	t.Parallel() // it mostly waits for its own processes (Node, Chromium, nodes): beside the others
	a, err := auth.NewJWTAuth(auth.JWTConfig{SecretFile: writeFile(t, "secret", testSecret)})
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, func(c *gateway.Config) { c.Authenticate = a.Grant; c.AdminKey = testAdminKey })
	// The page as served holds no key.
	resp, err := http.Get(e.http.URL + "/")
	if err != nil {
		t.Fatal(err)
	}
	page, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK || strings.Contains(string(page), testAdminKey) {
		t.Fatalf("GET /: %d, or the page holds the admin key", resp.StatusCode)
	}

	mallory := e.dialAs(adminTokenFor(t, "mallory"))
	mallory.subscribe("m1", "orders.*")
	other := e.dialAs(adminTokenFor(t, "trent"))

	browser := browsertest.Start(t)
	p := openTab(t, browser, consoleState)
	p.Do(chromedp.Navigate(e.http.URL + "/?token=" + url.QueryEscape(adminTokenFor(t, "operator"))))
	p.WaitVisible(`#status[data-state="connected"]`)

	p.TypeInto("#admin-key", "not-the-key")
	p.Click("#admin-open")
	p.WaitVisible("#admin-error")
	if got := p.Text("#admin-error"); !strings.HasPrefix(got, "401") {
		t.Fatalf("wrong key: the page says %q, want 401", got)
	}
	if hidden, err := chromedp.Run(p.Context(), chromedp.Evaluate[bool](`document.getElementById("insp-panel").hidden`)); err != nil || !hidden {
		t.Fatalf("wrong key: inspector panel hidden=%v (%v), want hidden", hidden, err)
	}

	p.TypeInto("#admin-key", testAdminKey)
	p.Click("#admin-open")
	row := `#insp-body tr[data-id="` + mallory.id + `"]`
	p.WaitVisible(row)
	if got := p.Text(row); !strings.Contains(got, "mallory") || !strings.Contains(got, "orders.*") || !strings.Contains(got, "127.0.0.1") || !strings.Contains(got, "native") {
		t.Fatalf("mallory's row reads %q, want her sub, subscription, address and protocol", got)
	}
	p.WaitVisible(`#insp-body tr[data-sub="operator"]`) // the console's own connection
	leak, err := chromedp.Run(p.Context(), chromedp.Evaluate[bool](`document.documentElement.outerHTML.includes(`+jsString(testAdminKey)+`) ||
		document.getElementById("admin-key").value !== "" || localStorage.length > 0 || sessionStorage.length > 0 || location.href.includes("admin")`))
	if err != nil || leak {
		t.Fatalf("the admin key is in the page, its field, storage or URL (%v)", err)
	}

	// Filter by sub: mallory's connection only.
	p.TypeInto("#insp-sub", "mallory")
	p.Click("#insp-apply")
	p.Do(chromedp.PollFunction[chromedp.Void](`() => document.querySelectorAll("#insp-body tr").length === 1`,
		chromedp.WithPollingMutation(), chromedp.WithPollingTimeout(0)))
	if got := p.Text("#insp-count"); got != "1" {
		t.Fatalf("filtered by sub mallory: %s listed", got)
	}

	// Close her connection with 4003.
	p.Do(chromedp.Evaluate[chromedp.Void](`document.getElementById("insp-code").value = "4003"`))
	p.Click(row + " button.close")
	p.WaitVisible(`#insp-result[data-ok="true"]`)
	if got := p.Text("#insp-result"); got != "connection "+mallory.id+": closed 1 with 4003" {
		t.Fatalf("close result reads %q", got)
	}
	if got := mallory.closeStatus(5 * time.Second); got != 4003 {
		t.Fatalf("mallory's connection closed with %d, want 4003", got)
	}
	// The other connection is untouched.
	other.send(`{"type":"subscribe","id":"t","subject":"orders.1"}`)
	other.expect(map[string]any{"type": "subscribed", "id": "t"})
}

// TestConsoleInspectorApart: with the inspector on its own listener
// (AdminApart), that listener's / is the console as the inspector's page:
// its Inspector alone, which lists and closes the client listener's
// connections, and no WebSocket of its own (there is no /ws there). The
// client listener's console says its node serves no admin API there.
func TestConsoleInspectorApart(t *testing.T) {
	t.Parallel() // it mostly waits for its own processes (Node, Chromium, nodes): beside the others
	e, admin := startAdminApart(t)
	c := e.dial()
	c.subscribe("s", "orders.*")
	browser := browsertest.Start(t)

	p := openTab(t, browser, consoleState)
	p.Do(chromedp.Navigate(admin + "/"))
	p.WaitVisible("#admin-key")
	shown, err := chromedp.Run(p.Context(), chromedp.Evaluate[[]string](`[...document.querySelectorAll("section, #status, #reconnect")]
		.filter((el) => getComputedStyle(el).display !== "none" && !el.hidden).map((el) => el.querySelector("h2")?.textContent || el.id)`))
	if err != nil || len(shown) != 1 || shown[0] != "Inspector" {
		t.Fatalf("the inspector's page shows %q (%v), want its Inspector alone", shown, err)
	}
	if got := p.Text("header h1"); got != "fanwire inspector" {
		t.Fatalf("the inspector's page is titled %q", got)
	}
	p.TypeInto("#admin-key", testAdminKey)
	p.Click("#admin-open")
	row := `#insp-body tr[data-id="` + c.id + `"]`
	p.WaitVisible(row)
	if got := p.Text("#insp-count"); got != "1" {
		t.Fatalf("%s connections listed, want the test's one: the page opened none", got)
	}
	p.Do(chromedp.Evaluate[chromedp.Void](`document.getElementById("insp-code").value = "4003"`))
	p.Click(row + " button.close")
	p.WaitVisible(`#insp-result[data-ok="true"]`)
	if got := c.closeStatus(5 * time.Second); got != 4003 {
		t.Fatalf("closed from the inspector's page with %d, want 4003", got)
	}

	live := openConsole(t, browser, e.http.URL)
	live.TypeInto("#admin-key", testAdminKey)
	live.Click("#admin-open")
	live.WaitVisible("#admin-error")
	if got := live.Text("#admin-error"); !strings.HasPrefix(got, "404") || !strings.Contains(got, "--admin-listen") {
		t.Fatalf("the client listener's console says %q, want a 404 pointing at --admin-listen", got)
	}
}

func jsString(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	b.WriteString(strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(s))
	b.WriteByte('"')
	return b.String()
}
