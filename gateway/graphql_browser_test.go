package gateway_test

import (
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"
	"github.com/fanwire/fanwire/gateway"
	"github.com/fanwire/fanwire/gateway/browsertest"
)

// TestGraphQLBrowser runs graphql-ws's UMD build in a real headless Chromium:
// testdata/graphqlws/page.html, served by the test's own HTTP server (another
// origin than the gateway's, which AllowedOrigins admits), subscribes to the
// gateway's /graphql and writes each event into the DOM.
func TestGraphQLBrowser(t *testing.T) {
	t.Parallel() // it mostly waits for its own processes (Node, Chromium, nodes): beside the others
	requireGraphQLModules(t)
	// The page and the UMD build, from the fixture folder: no route is
	// added to the gateway.
	pages := httptest.NewServer(http.FileServer(http.Dir(graphqlFixture)))
	t.Cleanup(pages.Close)
	browser := browsertest.Start(t) // closed before the servers: cleanups run last-in first-out

	allowed := func(c *gateway.Config) {
		c.Subjects = []string{"orders.>", "app.>"}
		c.AllowedOrigins = []string{"127.0.0.1:*"}
		c.AllowAnonymousPublish = true // publishAPI publishes without a key
	}
	for _, kind := range graphqlNodeKinds {
		t.Run(kind, func(t *testing.T) {
			e := newEnvOn(t, kind, allowed)
			p := openGraphQLPage(t, browser, pages.URL, e, "app.>")
			e.waitSubscriptions(1)

			events := []pubEvent{
				{"app.1", `{"n":1,"s":"<b>not markup</b> & é"}`},
				{"orders.1", `{"n":0}`}, // outside app.>
				{"app.2.x", `[1,"two",null]`},
			}
			cursors := e.publishAPI(events...)
			p.WaitVisible(`#events li.event:nth-child(2)`)
			want := []string{
				"app.1|" + cursorAt(cursors, 0) + `|{"n":1,"s":"<b>not markup</b> & é"}`,
				"app.2.x|" + cursorAt(cursors, 2) + `|[1,"two",null]`,
			}
			if got := graphqlEvents(t, p); !slices.Equal(got, want) {
				t.Fatalf("page shows events\n%q\nwant\n%q", got, want)
			}
			// The text is rendered as text, not markup.
			if got := textContent(t, p, `#events li.event:nth-child(1)`); got != `app.1 {"n":1,"s":"<b>not markup</b> & é"}` {
				t.Fatalf("first event reads %q", got)
			}
			if got := textContent(t, p, "#error"); got != "" {
				t.Fatalf("#error reads %q, want empty", got)
			}
		})
	}

	t.Run("bad pattern", func(t *testing.T) {
		e := newEnvOn(t, "nats", allowed)
		p := openGraphQLPage(t, browser, pages.URL, e, "a..b")
		p.WaitVisible(`#error[data-code]`)
		if got := textContent(t, p, "#error"); got != `bad_pattern: bad pattern: pattern "a..b" has an empty token` {
			t.Fatalf("#error reads %q", got)
		}
		if got := textContent(t, p, "#status"); got != "connected" {
			t.Fatalf("#status reads %q after the error, want connected (an error ends the operation, not the connection)", got)
		}
	})

	t.Run("origin not allowed", func(t *testing.T) {
		e := newEnvOn(t, "nats", func(c *gateway.Config) { c.Subjects = []string{"app.>"} })
		p := openTab(t, browser, graphqlPageState)
		p.Do(chromedp.Navigate(graphqlPageURL(pages.URL, e, "app.>")))
		p.WaitVisible(`#status[data-state="closed"]`)
		if got := textContent(t, p, "#status"); got != "closed 1006" {
			t.Fatalf("#status reads %q, want the refused handshake: closed 1006", got)
		}
		p.WaitVisible(`#error[data-code]`)
		if got := textContent(t, p, "#error"); got != "socket: error" {
			t.Fatalf("#error reads %q, want the socket's error event (socket: error)", got)
		}
		if n := e.metric("fanwire_connections_accepted_total", nil); n != 0 {
			t.Fatalf("fanwire_connections_accepted_total = %v, want 0: a foreign origin must be refused", n)
		}
	})
}

// graphqlPageState describes page.html for a failure.
const graphqlPageState = `document.body ? document.body.innerText : "(no body)"`

// graphqlPageURL is page.html on the pages server, subscribing to subject on e.
func graphqlPageURL(pages string, e *env, subject string) string {
	gw := "ws" + strings.TrimPrefix(e.http.URL, "http") + "/graphql"
	return pages + "/page.html?" + url.Values{"gw": {gw}, "subject": {subject}}.Encode()
}

// openGraphQLPage opens page.html subscribing to subject on e and waits
// until its client is connected.
func openGraphQLPage(t *testing.T, browser *browsertest.Browser, pages string, e *env, subject string) *browsertest.Page {
	t.Helper()
	p := openTab(t, browser, graphqlPageState)
	p.Do(chromedp.Navigate(graphqlPageURL(pages, e, subject)))
	p.WaitVisible(`#status[data-state="connected"]`)
	return p
}

// textContent returns the text content of the first element matching sel.
func textContent(t testing.TB, p *browsertest.Page, sel string) string {
	t.Helper()
	return strings.TrimSpace(browsertest.Eval[string](p, `document.querySelector(`+strconv.Quote(sel)+`).textContent`))
}

// graphqlEvents returns the page's events in order, as subject|cursor|data.
func graphqlEvents(t testing.TB, p *browsertest.Page) []string {
	t.Helper()
	return browsertest.Eval[[]string](p,
		`Array.from(document.querySelectorAll("#events li.event"), li => li.dataset.subject + "|" + li.dataset.cursor + "|" + li.querySelector(".data").textContent)`)
}
