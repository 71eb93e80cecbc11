package gateway_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/fanwire/fanwire/gateway"
)

// TestGraphQLBrowser runs graphql-ws's UMD build in a real headless Chromium:
// testdata/graphqlws/page.html, served by the test's own HTTP server (another
// origin than the gateway's, which AllowedOrigins admits), subscribes to the
// gateway's /graphql and writes each event into the DOM.
func TestGraphQLBrowser(t *testing.T) {
	requireGraphQLModules(t)
	// The page and the UMD build, from the fixture folder: no route is
	// added to the gateway.
	pages := httptest.NewServer(http.FileServer(http.Dir(graphqlFixture)))
	t.Cleanup(pages.Close)
	browser := newBrowser(t) // closed before the servers: cleanups run last-in first-out

	allowed := func(c *gateway.Config) {
		c.Subjects = []string{"orders.>", "app.>"}
		c.AllowedOrigins = []string{"127.0.0.1:*"}
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
			p.waitVisible(`#events li.event:nth-child(2)`)
			want := []string{
				"app.1|" + cursorAt(cursors, 0) + `|{"n":1,"s":"<b>not markup</b> & é"}`,
				"app.2.x|" + cursorAt(cursors, 2) + `|[1,"two",null]`,
			}
			if got := p.events(); !slices.Equal(got, want) {
				t.Fatalf("page shows events\n%q\nwant\n%q", got, want)
			}
			// The text is rendered as text, not markup.
			if got := p.text(`#events li.event:nth-child(1)`); got != `app.1 {"n":1,"s":"<b>not markup</b> & é"}` {
				t.Fatalf("first event reads %q", got)
			}
			if got := p.text("#error"); got != "" {
				t.Fatalf("#error reads %q, want empty", got)
			}
		})
	}

	t.Run("bad pattern", func(t *testing.T) {
		e := newEnvOn(t, "nats", allowed)
		p := openGraphQLPage(t, browser, pages.URL, e, "a..b")
		p.waitVisible(`#error[data-code]`)
		if got := p.text("#error"); got != `bad_pattern: bad pattern: pattern "a..b" has an empty token` {
			t.Fatalf("#error reads %q", got)
		}
		if got := p.text("#status"); got != "connected" {
			t.Fatalf("#status reads %q after the error, want connected (an error ends the operation, not the connection)", got)
		}
	})

	t.Run("origin not allowed", func(t *testing.T) {
		e := newEnvOn(t, "nats", func(c *gateway.Config) { c.Subjects = []string{"app.>"} })
		p := newGraphQLPage(t, browser)
		p.do(chromedp.Navigate(p.url(pages.URL, e, "app.>")))
		p.waitVisible(`#status[data-state="closed"]`)
		if got := p.text("#status"); got != "closed 1006" {
			t.Fatalf("#status reads %q, want the refused handshake: closed 1006", got)
		}
		p.waitVisible(`#error[data-code]`)
		if got := p.text("#error"); got != "socket: error" {
			t.Fatalf("#error reads %q, want the socket's error event (socket: error)", got)
		}
		if n := e.metric("fanwire_connections_accepted_total", nil); n != 0 {
			t.Fatalf("fanwire_connections_accepted_total = %v, want 0: a foreign origin must be refused", n)
		}
	})
}

// graphqlPage is one tab on page.html.
type graphqlPage struct {
	t   *testing.T
	tab context.Context // outlives ctx, so a failure can still read the page
	ctx context.Context // every step, bounded by consoleTimeout together

	mu       sync.Mutex
	messages []chromedp.ConsoleMessage // guarded by mu
}

// newGraphQLPage opens a blank tab; its cleanup closes it and fails the test
// on any uncaught exception in the page.
func newGraphQLPage(t *testing.T, browser context.Context) *graphqlPage {
	t.Helper()
	life, endLife := context.WithTimeout(browser, consoleTimeout+5*time.Second)
	tab, closeTab := chromedp.NewContext(life)
	ctx, cancelSteps := context.WithTimeout(tab, consoleTimeout)
	p := &graphqlPage{t: t, tab: tab, ctx: ctx}
	var wg sync.WaitGroup
	t.Cleanup(func() {
		cancelSteps()
		closeTab()
		endLife()
		wg.Wait()
		p.mu.Lock()
		defer p.mu.Unlock()
		for _, m := range p.messages {
			if m.IsException() {
				t.Errorf("page threw: %s", m)
			} else if t.Failed() {
				t.Logf("page console: %s (%s)", m, m.URL)
			}
		}
	})
	messages := chromedp.Console(tab)
	wg.Go(func() {
		for m, err := range messages {
			if err != nil {
				return
			}
			p.mu.Lock()
			p.messages = append(p.messages, m)
			p.mu.Unlock()
		}
	})
	return p
}

// url is page.html on the pages server, subscribing to subject on e.
func (p *graphqlPage) url(pages string, e *env, subject string) string {
	gw := "ws" + strings.TrimPrefix(e.http.URL, "http") + "/graphql"
	return pages + "/page.html?" + url.Values{"gw": {gw}, "subject": {subject}}.Encode()
}

// openGraphQLPage opens page.html subscribing to subject on e and waits
// until its client is connected.
func openGraphQLPage(t *testing.T, browser context.Context, pages string, e *env, subject string) *graphqlPage {
	t.Helper()
	p := newGraphQLPage(t, browser)
	p.do(chromedp.Navigate(p.url(pages, e, subject)))
	p.waitVisible(`#status[data-state="connected"]`)
	return p
}

func (p *graphqlPage) do(steps ...chromedp.Action[chromedp.Void]) {
	p.t.Helper()
	if err := chromedp.Do(p.ctx, steps...); err != nil {
		p.fatal(err)
	}
}

func (p *graphqlPage) waitVisible(sel string) {
	p.t.Helper()
	if err := chromedp.Do(p.ctx, chromedp.WaitVisible(chromedp.CSS(sel))); err != nil {
		p.fatal(fmt.Errorf("waiting for %s: %w", sel, err))
	}
}

// text returns the rendered text of the first element matching sel.
func (p *graphqlPage) text(sel string) string {
	p.t.Helper()
	s, err := chromedp.Run(p.ctx, chromedp.Evaluate[string](`document.querySelector(`+strconv.Quote(sel)+`).textContent`))
	if err != nil {
		p.fatal(err)
	}
	return strings.TrimSpace(s)
}

// events returns the page's events in order, as subject|cursor|data.
func (p *graphqlPage) events() []string {
	p.t.Helper()
	evs, err := chromedp.Run(p.ctx, chromedp.Evaluate[[]string](
		`Array.from(document.querySelectorAll("#events li.event"), li => li.dataset.subject + "|" + li.dataset.cursor + "|" + li.querySelector(".data").textContent)`))
	if err != nil {
		p.fatal(err)
	}
	return evs
}

// fatal fails the test with err and what the page shows.
func (p *graphqlPage) fatal(err error) {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(p.tab, 2*time.Second)
	defer cancel()
	state, serr := chromedp.Run(ctx, chromedp.Evaluate[string](`document.body ? document.body.innerText : "(no body)"`))
	if serr != nil {
		state = "(unavailable: " + serr.Error() + ")"
	}
	p.t.Fatalf("%v\n--- page ---\n%s", err, state)
}
