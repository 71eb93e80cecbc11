package gateway_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/fanwire/fanwire/gateway"
)

// The console page (gateway/console/index.html) is tested end to end in a real
// headless Chromium: the page's own WebSocket client against the gateway, and
// its publish form against /api/publish.

const (
	// consoleTimeout bounds every step of one subtest together, from loading
	// the page to the last check, so a page that never reaches a state fails
	// instead of hanging CI.
	consoleTimeout = 20 * time.Second
	// browserStartTimeout bounds Chromium's start: ~3 s under -race on this
	// 2-core machine, so 30 s leaves room for a loaded CI runner.
	browserStartTimeout = 30 * time.Second
	// browserCloseTimeout bounds the graceful close; past it the process is killed.
	browserCloseTimeout = 10 * time.Second
)

func TestConsole(t *testing.T) {
	t.Parallel() // it mostly waits for its own processes (Node, Chromium, nodes): beside the others
	// As fanwire dev: the page's form publishes without a key.
	e := newEnv(t, func(c *gateway.Config) { c.AllowAnonymousPublish = true })
	browser := newBrowser(t) // closed before the gateway: cleanups run last-in first-out

	t.Run("subscribe and publish", func(t *testing.T) {
		p := openConsole(t, browser, e.http.URL)

		p.typeInto("#pattern", "orders.*")
		p.do(chromedp.Click(chromedp.ID("subscribe")))
		p.waitVisible(`#subs li.sub[data-state="active"]`)
		if got := p.text(`#subs li.sub[data-state="active"] .pat`); got != "orders.*" {
			t.Fatalf("active subscription shows pattern %q, want orders.*", got)
		}

		// From outside, straight into NATS. customers.1, which orders.*
		// does not match, goes first on the same connection: the full log
		// is checked below.
		e.publish("customers.1", `{"id":1}`)
		e.publish("orders.42", `{"id":42,"status":"paid"}`)
		p.waitVisible(`#events .event[data-subject="orders.42"]`)
		if got := p.text(`#events .event[data-subject="orders.42"]`); !strings.Contains(got, "paid") || !strings.Contains(got, "subs: s1") {
			t.Fatalf("orders.42 entry reads %q, want its data (paid) and subs: s1", got)
		}

		// From the page's own publish form, through /api/publish.
		p.typeInto("#pub-subject", "orders.7")
		p.typeInto("#pub-data", `{"id":7}`)
		p.do(chromedp.Click(chromedp.ID("publish")))
		p.waitVisible(`#pub-result[data-ok="true"]`)
		if got := p.text("#pub-result"); !strings.HasPrefix(got, "200 ") || !strings.Contains(got, `"published": 1`) {
			t.Fatalf("publish result reads %q, want 200 and published: 1", got)
		}
		p.waitVisible(`#events .event[data-subject="orders.7"]`)
		if got := p.text(`#events .event[data-subject="orders.7"]`); !strings.Contains(got, `"id": 7`) {
			t.Fatalf("orders.7 entry reads %q, want its data", got)
		}

		// A burst with one flush: the gateway coalesces queued events into
		// one frame, newline-separated, and the page must split it. All
		// arrive, in order (the log shows the newest first).
		const burst = 50
		for i := range burst {
			if err := e.nc.Publish(fmt.Sprintf("orders.b%d", i), fmt.Appendf(nil, `{"n":%d}`, i)); err != nil {
				t.Fatal(err)
			}
		}
		if err := e.nc.Flush(); err != nil {
			t.Fatal(err)
		}
		p.waitVisible(fmt.Sprintf(`#events .event[data-subject="orders.b%d"]`, burst-1))
		var want []string
		for i := burst - 1; i >= 0; i-- {
			want = append(want, fmt.Sprintf("orders.b%d", i))
		}
		want = append(want, "orders.7", "orders.42") // and no customers.1
		if got := p.eventSubjects(); !slices.Equal(got, want) {
			t.Fatalf("event log shows subjects %q, want %q", got, want)
		}
		n := strconv.Itoa(len(want))
		if got := p.text("#count"); got != n {
			t.Fatalf("event counter shows %q, want %s", got, n)
		}
		if got := p.text(`#subs li.sub[data-state="active"] .st`); !strings.HasPrefix(got, n+" ev") {
			t.Fatalf("subscription counter shows %q, want %s ev", got, n)
		}
	})

	t.Run("server errors", func(t *testing.T) {
		p := openConsole(t, browser, e.http.URL)
		connected := p.text("#status") // "connected · <connection id>"

		// A pattern the server refuses: the sub turns to error with the
		// code, and the log shows the error with its message.
		p.typeInto("#pattern", "orders..x")
		p.do(chromedp.Click(chromedp.ID("subscribe")))
		p.waitVisible(`#subs li.sub[data-id="s1"][data-state="error"]`)
		if got := p.text(`#subs li.sub[data-id="s1"] .st`); got != "bad_pattern" {
			t.Fatalf("refused subscription shows %q, want bad_pattern", got)
		}
		p.waitVisible(`#events .entry.error`)
		if got := p.text(`#events .entry.error`); !strings.Contains(got, "bad_pattern") ||
			!strings.Contains(got, "id: s1") || !strings.Contains(got, "empty token") {
			t.Fatalf("error entry reads %q, want the code, the id and the server's message", got)
		}
		// A refused subscription costs neither the connection nor the
		// next subscription.
		p.typeInto("#pattern", "orders.*")
		p.do(chromedp.Click(chromedp.ID("subscribe")))
		p.waitVisible(`#subs li.sub[data-id="s2"][data-state="active"]`)
		if got := p.text("#status"); got != connected {
			t.Fatalf("status reads %q after the error, want %q (the same connection)", got, connected)
		}

		// A publish the server refuses shows its status and error body.
		p.typeInto("#pub-subject", "orders..x")
		p.do(chromedp.Click(chromedp.ID("publish")))
		p.waitVisible(`#pub-result[data-ok="false"]`)
		if got := p.text("#pub-result"); !strings.HasPrefix(got, "400 ") || !strings.Contains(got, "empty token") {
			t.Fatalf("refused publish reads %q, want 400 and the server's error", got)
		}
	})
}

// TestConsoleView: the console's View (a live view: from "latest" with an
// optional where) shows a table of the newest document of each subject
// that passes, a row per subject, sorted, kept up to date in place, and
// says where it synced, or why the gateway refused it.
func TestConsoleView(t *testing.T) {
	t.Parallel() // it mostly waits for its own processes (Node, Chromium, nodes): beside the others
	// orders.> stands for the ingest's subjects: only there is a
	// truncate-shaped event a truncate.
	e := newEnvOn(t, "jetstream", func(c *gateway.Config) { c.ReservedSubjects = []string{"orders.>"} })
	browser := newBrowser(t) // closed before the gateway: cleanups run last-in first-out

	t.Run("snapshot then live", func(t *testing.T) {
		// Before the view opens: ingest-shaped events, several for some
		// subjects; the view shows each subject's newest document.
		e.store("orders.1", row("insert", 1, `{"id":1,"status":"open","total":5}`))
		e.store("orders.2", row("insert", 2, `{"id":2,"status":"closed","total":7}`))
		e.store("orders.3", row("insert", 3, `{"id":3,"status":"open","total":9}`))
		e.store("orders.10", row("insert", 10, `{"id":10,"status":"open","total":1.5}`))
		e.store("orders.4", row("insert", 4, `{"id":4,"status":"open","total":2}`))
		e.store("orders.4", row("delete", 4, ""))
		e.store("app.1", `{"doc":{"status":"open"}}`) // not under the pattern
		synced := e.store("orders.1", row("update", 1, `{"id":1,"status":"open","total":6}`))

		p := openConsole(t, browser, e.http.URL)
		p.openView("orders.*", "doc.status == 'open'")
		p.waitVisible(`#view-status[data-state="synced"]`)
		if got, want := p.text("#view-status"), "synced at "+synced; got != want {
			t.Fatalf("view status reads %q, want %q", got, want)
		}
		// Complete at synced: no waiting for these rows. Sorted by
		// subject, orders.10 after orders.3.
		p.checkRows(
			"orders.1 id=1 status=open total=6",
			"orders.3 id=3 status=open total=9",
			"orders.10 id=10 status=open total=1.5",
		)
		if got := p.text("#view-count"); got != "3" {
			t.Fatalf("row count reads %q, want 3", got)
		}

		// Live. An update in place changes the cells of the same row
		// (marked here: a re-rendered table would lose the mark).
		p.do(chromedp.Evaluate[chromedp.Void](`document.querySelector('#view-body tr[data-key="orders.3"]').marked = true`))
		e.store("orders.3", row("update", 3, `{"id":3,"status":"open","total":12}`))
		p.waitRows(
			"orders.1 id=1 status=open total=6",
			"orders.3 id=3 status=open total=12",
			"orders.10 id=10 status=open total=1.5",
		)
		if marked, err := chromedp.Run(p.ctx, chromedp.Evaluate[bool](
			`document.querySelector('#view-body tr[data-key="orders.3"]').marked === true`)); err != nil || !marked {
			t.Fatalf("orders.3's row was replaced, not updated in place (marked %v, %v)", marked, err)
		}
		// An update into the filter adds a row, in its place.
		e.store("orders.2", row("update", 2, `{"id":2,"status":"open","total":7}`))
		p.waitRows(
			"orders.1 id=1 status=open total=6",
			"orders.2 id=2 status=open total=7",
			"orders.3 id=3 status=open total=12",
			"orders.10 id=10 status=open total=1.5",
		)
		// An update out of the filter (a leave) and a delete remove
		// rows; a document with a new field adds a column.
		e.store("orders.1", row("update", 1, `{"id":1,"status":"shipped","total":6}`))
		e.store("orders.10", row("delete", 10, ""))
		e.store("orders.5", row("insert", 5, `{"id":5,"status":"open","total":3,"note":"rush"}`))
		p.waitRows(
			"orders.2 id=2 status=open total=7",
			"orders.3 id=3 status=open total=12",
			"orders.5 id=5 status=open total=3 note=rush",
		)
		// A truncate of the table empties the view; later rows come back.
		e.store("orders.%truncate", `{"op":"truncate","key":null,"doc":null}`)
		p.waitRows()
		p.waitVisible("#view-empty")
		e.store("orders.6", row("insert", 6, `{"id":6,"status":"open","total":4}`))
		p.waitRows("orders.6 id=6 status=open total=4")
		if got := p.text("#view-count"); got != "1" {
			t.Fatalf("row count reads %q, want 1", got)
		}
		if got, want := p.text("#view-status"), "synced at "+synced; got != want {
			t.Fatalf("view status reads %q after live changes, want %q", got, want)
		}

		// Another view replaces it. Without a where the snapshot holds
		// every subject's newest event: the truncate removes the
		// documents before it, a delete is no row, orders.6 stays.
		synced = e.store("orders.7", row("insert", 7, `{"id":7,"status":"closed","total":8}`))
		p.openView("orders.*", "")
		p.waitVisible(`#view-status[data-state="synced"]`)
		if got, want := p.text("#view-status"), "synced at "+synced; got != want {
			t.Fatalf("the second view's status reads %q, want %q", got, want)
		}
		p.checkRows(
			"orders.6 id=6 status=open total=4",
			"orders.7 id=7 status=closed total=8",
		)
		if got := p.text("#view-title"); got != "orders.*" {
			t.Fatalf("view title reads %q, want orders.*", got)
		}
		// Unfiltered, a delete arrives as the event itself.
		e.store("orders.6", row("delete", 6, ""))
		p.waitRows("orders.7 id=7 status=closed total=8")

		// Nothing failed on the way, in the page's callbacks either
		// (fanwire.js reports those as errors, which the log shows).
		if n, err := chromedp.Run(p.ctx, chromedp.Evaluate[int](`document.querySelectorAll("#events .entry.error").length`)); err != nil || n != 0 {
			t.Fatalf("the event log shows %d errors (%v), want none", n, err)
		}
	})

	t.Run("bad where", func(t *testing.T) {
		p := openConsole(t, browser, e.http.URL)
		p.openView("orders.*", "doc.status ==")
		p.waitVisible(`#view-status[data-state="error"]`)
		if got := p.text("#view-status"); !strings.HasPrefix(got, "bad_filter: ") || !strings.Contains(got, "1:14") {
			t.Fatalf("view status reads %q, want bad_filter and the position (1:14)", got)
		}
		p.checkRows()
		// The connection stays: a good where opens.
		p.openView("orders.*", "doc.total > 100")
		p.waitVisible(`#view-status[data-state="synced"]`)
		p.checkRows()
		p.waitVisible("#view-empty")
	})

	t.Run("too large", func(t *testing.T) {
		e := newEnvOn(t, "jetstream", func(c *gateway.Config) { c.MaxSnapshot = 2 })
		for i := 1; i <= 3; i++ {
			e.store("orders."+strconv.Itoa(i), row("insert", i, `{"id":`+strconv.Itoa(i)+`}`))
		}
		p := openConsole(t, browser, e.http.URL)
		p.openView("orders.*", "")
		p.waitVisible(`#view-status[data-state="error"]`)
		if got := p.text("#view-status"); !strings.HasPrefix(got, "view_too_large: ") || !strings.Contains(got, "--max-snapshot") {
			t.Fatalf("view status reads %q, want view_too_large naming --max-snapshot", got)
		}
		p.checkRows() // an incomplete view is not shown
	})

	t.Run("core nats", func(t *testing.T) {
		e := newEnv(t, nil)
		p := openConsole(t, browser, e.http.URL)
		p.openView("orders.*", "")
		p.waitVisible(`#view-status[data-state="error"]`)
		if got := p.text("#view-status"); !strings.HasPrefix(got, "bad_cursor: ") || !strings.Contains(got, "keeps no history") ||
			!strings.Contains(got, "JetStream") {
			t.Fatalf("view status reads %q, want bad_cursor, the server's message and what a view needs", got)
		}
	})
}

// viewRowsJS reads the console's view table, a string per row: the subject,
// then field=value for each cell that has a value, in column order.
const viewRowsJS = `() => Array.from(document.querySelectorAll("#view-body tr"), (tr) =>
	[tr.dataset.key, ...Array.from(tr.querySelectorAll("td:not(.missing)"),
		(td) => (td.dataset.col ?? "(document)") + "=" + td.textContent)].join(" "))`

// openView opens a view in the console's View form.
func (p *browserPage) openView(pattern, where string) {
	p.t.Helper()
	p.typeInto("#view-pattern", pattern)
	p.typeInto("#view-where", where)
	p.do(chromedp.Click(chromedp.ID("open-view")))
}

// checkRows fails the test unless the view table shows want now.
func (p *browserPage) checkRows(want ...string) {
	p.t.Helper()
	got, err := chromedp.Run(p.ctx, chromedp.Evaluate[[]string]("("+viewRowsJS+")()"))
	if err != nil {
		p.fatal(err)
	}
	if !slices.Equal(got, want) {
		p.t.Fatalf("view table shows\n  %s\nwant\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
}

// waitRows waits until the view table shows want, checking on every change
// of the page.
func (p *browserPage) waitRows(want ...string) {
	p.t.Helper()
	if want == nil {
		want = []string{}
	}
	js, err := json.Marshal(want)
	if err != nil {
		p.t.Fatal(err)
	}
	if err := chromedp.Do(p.ctx, chromedp.PollFunction[chromedp.Void](
		"(want) => JSON.stringify(("+viewRowsJS+")()) === want",
		chromedp.WithPollingMutation(), chromedp.WithPollingTimeout(0), chromedp.WithPollingArgs(string(js)),
	)); err != nil {
		p.fatal(fmt.Errorf("waiting for the view table to show %s: %w", js, err))
	}
}

// chromiumPath finds Debian's chromium. A missing browser fails the test:
// skipping would let CI pass without ever running the page.
func chromiumPath(t testing.TB) string {
	t.Helper()
	if testing.Short() {
		t.Skip("-short (make test-quick) leaves out the tests that start Chromium: make test runs them")
	}
	if p, err := exec.LookPath("chromium"); err == nil {
		return p
	}
	const debian = "/usr/bin/chromium"
	if _, err := os.Stat(debian); err == nil {
		return debian
	}
	t.Fatal("chromium not found (PATH, /usr/bin/chromium): run `make test`, which installs it, or `apt-get install chromium`")
	return ""
}

// newBrowser starts one headless Chromium and returns its chromedp context.
// Its cleanup closes the browser gracefully and returns only once the process
// has exited and chromedp's goroutines have ended.
func newBrowser(t testing.TB) context.Context {
	t.Helper()
	exe := chromiumPath(t)
	dataDir := t.TempDir() // removed after the cleanup below: cleanups run in reverse

	// life bounds the browser: canceling it kills the process.
	life, endLife := context.WithCancel(context.Background())
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(life, slices.Concat(
		chromedp.DefaultExecAllocatorOptions[:], // headless, no-first-run, disable-background-networking, disable-sync, ...
		[]chromedp.ExecAllocatorOption{
			chromedp.ExecPath(exe),
			chromedp.NoSandbox, // CI runs as root
			chromedp.DisableGPU,
			chromedp.Flag("disable-quic", true),
			chromedp.Flag("disable-component-update", true),
			chromedp.UserDataDir(dataDir),
			chromedp.WindowSize(1280, 900),
		},
	)...)
	ctx, cancelBrowser := chromedp.NewContext(allocCtx)
	t.Cleanup(func() {
		cctx, ccancel := context.WithTimeout(ctx, browserCloseTimeout)
		defer ccancel()
		// Cancel closes the browser and waits for its process to exit.
		if err := chromedp.Cancel(cctx); err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("closing chromium: %v", err)
		}
		cancelBrowser() // waits for the browser's tab and process
		cancelAlloc()   // waits for the allocator's goroutines
		endLife()
	})

	// The first Run starts the browser and binds its life to ctx, so it
	// cannot carry a deadline; the watchdog kills a start that hangs.
	watchdog := time.AfterFunc(browserStartTimeout, endLife)
	err := chromedp.Do(ctx)
	if !watchdog.Stop() {
		t.Fatalf("chromium did not start within %v: %v", browserStartTimeout, err)
	}
	if err != nil {
		t.Fatalf("starting %s: %v", exe, err)
	}
	return ctx
}

// browserPage is one tab of a test's headless browser.
type browserPage struct {
	t     testing.TB
	tab   context.Context // the tab; it outlives ctx so a failure can still read the page
	ctx   context.Context // every step, bounded by consoleTimeout together
	state string          // a script whose string result describes the page, for failures

	mu       sync.Mutex
	messages []chromedp.ConsoleMessage // the page's console, guarded by mu
}

// consoleState describes the console page for a failure.
const consoleState = `"status: " + document.getElementById("status").textContent +
		"\nsubs: " + document.getElementById("subs").innerText +
		"\npub-result: " + document.getElementById("pub-result").textContent +
		"\nview: " + document.getElementById("view-title").textContent +
		"\nview status: " + document.getElementById("view-status").textContent +
		"\nview table:\n" + document.getElementById("view-table").innerText +
		"\nevents:\n" + document.getElementById("events").innerText`

// openTab opens a blank tab in browser. Every step in the tab fails after
// consoleTimeout; its cleanup closes the tab and fails the test on any
// uncaught exception in the page. state describes the page on a failure.
func openTab(t testing.TB, browser context.Context, state string) *browserPage {
	t.Helper()
	// The tab's own life has a deadline too (its first Run binds it), a
	// little past the steps' so that fatal can still read the page.
	life, endLife := context.WithTimeout(browser, consoleTimeout+5*time.Second)
	tab, closeTab := chromedp.NewContext(life)
	ctx, cancelSteps := context.WithTimeout(tab, consoleTimeout)
	p := &browserPage{t: t, tab: tab, ctx: ctx, state: state}

	var wg sync.WaitGroup
	t.Cleanup(func() {
		cancelSteps()
		closeTab() // closes the tab and waits for it
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
	// Console opens the tab and subscribes before it returns, so the
	// collector sees the page from its first script on; it ends when the
	// tab does.
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

// openConsole opens the console at base+"/" in a new tab of browser and waits
// until its WebSocket is connected.
func openConsole(t *testing.T, browser context.Context, base string) *browserPage {
	t.Helper()
	p := openTab(t, browser, consoleState)
	p.do(chromedp.Navigate(base + "/"))
	p.waitVisible(`#status[data-state="connected"]`)
	return p
}

// do runs the steps in the tab and fails the test with the page's state if one fails.
func (p *browserPage) do(steps ...chromedp.Action[chromedp.Void]) {
	p.t.Helper()
	if err := chromedp.Do(p.ctx, steps...); err != nil {
		p.fatal(err)
	}
}

func (p *browserPage) waitVisible(sel string) {
	p.t.Helper()
	if err := chromedp.Do(p.ctx, chromedp.WaitVisible(chromedp.CSS(sel))); err != nil {
		p.fatal(fmt.Errorf("waiting for %s: %w", sel, err))
	}
}

// typeInto replaces the value of an input or a textarea by typing, as a user
// does: clear, focus (the pattern field selects its text on focus), keys.
//
// The field is cleared with a script: chromedp v0.23.0's SetValue(sel, "")
// fails ("could not set value"), because it passes "" as a call argument that
// json v2's omitempty drops, so the page receives undefined. Clear sets the
// value attribute, which an input ignores once it has been edited.
func (p *browserPage) typeInto(sel, text string) {
	p.t.Helper()
	p.do(
		chromedp.WaitVisible(chromedp.CSS(sel)),
		chromedp.Evaluate[chromedp.Void]("document.querySelector("+strconv.Quote(sel)+").value = ''"),
		chromedp.SendKeys(chromedp.CSS(sel), text),
	)
	got, err := chromedp.Run(p.ctx, chromedp.Value(chromedp.CSS(sel)))
	if err != nil {
		p.fatal(err)
	}
	if got != text {
		p.t.Fatalf("%s holds %q after typing %q", sel, got, text)
	}
}

// text returns the rendered text of the first element matching sel.
func (p *browserPage) text(sel string) string {
	p.t.Helper()
	s, err := chromedp.Run(p.ctx, chromedp.Text(chromedp.CSS(sel)))
	if err != nil {
		p.fatal(err)
	}
	return strings.TrimSpace(s)
}

// eventSubjects returns the subjects of the event log's entries, newest first.
func (p *browserPage) eventSubjects() []string {
	p.t.Helper()
	subjects, err := chromedp.Run(p.ctx, chromedp.Evaluate[[]string](
		`Array.from(document.querySelectorAll("#events .event"), e => e.dataset.subject)`))
	if err != nil {
		p.fatal(err)
	}
	return subjects
}

// fatal fails the test with err and what the page shows, read on the tab
// with a short deadline of its own: p.ctx may be the one that expired.
func (p *browserPage) fatal(err error) {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(p.tab, 2*time.Second)
	defer cancel()
	state, serr := chromedp.Run(ctx, chromedp.Evaluate[string](p.state))
	if serr != nil {
		state = "(unavailable: " + serr.Error() + ")"
	}
	p.t.Fatalf("%v\n--- page ---\n%s", err, state)
}

// TestConsolePresence: the console's Presence shows the members of a
// subject, live: a member tracked by another connection appears with its
// state, changes in place, and disappears when it untracks or its
// connection closes.
func TestConsolePresence(t *testing.T) {
	t.Parallel() // it mostly waits for its own processes (Node, Chromium, nodes): beside the others
	e := newEnv(t, presenceCfg(nil))
	browser := newBrowser(t) // closed before the gateway: cleanups run last-in first-out
	p := openConsole(t, browser, e.http.URL)
	p.typeInto("#pres-subject", "room.1")
	p.do(chromedp.Click(chromedp.ID("show-members")))
	p.waitVisible(`#pres-status[data-state="synced"]`)
	p.waitVisible(`#pres-empty`)
	if got := p.text("#pres-count"); got != "0" {
		t.Fatalf("member count reads %q before anyone tracks, want 0", got)
	}

	a, b := e.dial(), e.dial()
	a.send(`{"type":"track","id":"t1","subject":"room.1","state":{"name":"ann"}}`)
	a.expect(map[string]any{"type": "tracked", "id": "t1"})
	row := func(c *client) string { return `#pres-body tr[data-conn="` + c.id + `"]` }
	p.waitVisible(row(a))
	if got := p.text(row(a)); !strings.Contains(got, a.id) || !strings.Contains(got, "(anonymous)") || !strings.Contains(got, `{"name":"ann"}`) {
		t.Fatalf("a's row reads %q, want its conn %s, (anonymous) and its state", got, a.id)
	}
	a.send(`{"type":"track","id":"t2","subject":"room.1","state":{"name":"ann","typing":true}}`)
	a.expect(map[string]any{"type": "tracked", "id": "t2"})
	p.waitVisible(row(a) + `[data-state='{"name":"ann","typing":true}']`)
	if got := p.text(row(a) + " td.state"); got != `{"name":"ann","typing":true}` {
		t.Fatalf("a's state reads %q after its update", got)
	}
	b.send(`{"type":"track","id":"t3","subject":"room.1"}`)
	b.expect(map[string]any{"type": "tracked", "id": "t3"})
	p.waitVisible(row(b))
	if got := p.text("#pres-count"); got != "2" {
		t.Fatalf("member count reads %q with a and b, want 2", got)
	}

	a.send(`{"type":"untrack","id":"u1","subject":"room.1"}`)
	a.expect(map[string]any{"type": "untracked", "id": "u1"})
	p.do(chromedp.WaitNotPresent(chromedp.CSS(row(a))))
	if got := p.text("#pres-count"); got != "1" {
		t.Fatalf("member count reads %q after a untracked, want 1", got)
	}
	_ = b.c.CloseNow() // a closed connection leaves
	p.do(chromedp.WaitNotPresent(chromedp.CSS(row(b))))
	p.waitVisible(`#pres-empty`)
	if got := p.text("#pres-count"); got != "0" {
		t.Fatalf("member count reads %q after everyone left, want 0", got)
	}

	// The page tracks itself: it is listed with its state, by its
	// connection id, until it untracks.
	conn := strings.TrimPrefix(p.text("#status"), "connected · ")
	p.typeInto("#pres-state", `{"name": "me"}`)
	p.do(chromedp.Click(chromedp.ID("track")))
	p.waitVisible(`#tracks li[data-subject="room.1"][data-state="tracked"]`)
	if got, want := p.text(`#tracks li[data-subject="room.1"] .st`), `as `+conn+` · {"name":"me"}`; got != want {
		t.Fatalf("the page's track reads %q, want %q", got, want)
	}
	self := `#pres-body tr[data-conn="` + conn + `"][data-state='{"name":"me"}']`
	p.waitVisible(self)
	p.do(chromedp.Click(chromedp.CSS(`#tracks li[data-subject="room.1"] button.untrack`)))
	p.do(chromedp.WaitNotPresent(chromedp.CSS(self)))
	p.waitVisible(`#pres-empty`)
	if got := p.text("#tracks"); got != "" {
		t.Fatalf("tracks read %q after the untrack, want none", got)
	}

	// A state that is not JSON is not sent.
	p.typeInto("#pres-state", `{name}`)
	p.do(chromedp.Click(chromedp.ID("track")))
	p.waitVisible(`#tracks li[data-subject="room.1"][data-state="error"]`)
	if got := p.text(`#tracks li[data-subject="room.1"] .st`); !strings.HasPrefix(got, "the state is not JSON") {
		t.Fatalf("a bad state reads %q", got)
	}
}
