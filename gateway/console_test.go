package gateway_test

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/fanwire/fanwire/gateway"
	"github.com/fanwire/fanwire/gateway/browsertest"
)

// The console page (gateway/console/index.html) is tested end to end in a real
// headless Chromium: the page's own WebSocket client against the gateway, and
// its publish form against /api/publish.

const (
	// consoleTimeout bounds every step of one subtest together, from loading
	// the page to the last check, so a page that never reaches a state fails
	// instead of hanging CI.
	consoleTimeout = 20 * time.Second
)

func TestConsole(t *testing.T) {
	t.Parallel() // it mostly waits for its own processes (Node, Chromium, nodes): beside the others
	// As fanwire dev: the page's form publishes without a key.
	e := newEnv(t, func(c *gateway.Config) { c.AllowAnonymousPublish = true })
	browser := browsertest.Start(t) // closed before the gateway: cleanups run last-in first-out

	t.Run("subscribe and publish", func(t *testing.T) {
		p := openConsole(t, browser, e.http.URL)

		p.TypeInto("#pattern", "orders.*")
		p.Click("#subscribe")
		p.WaitVisible(`#subs li.sub[data-state="active"]`)
		if got := p.Text(`#subs li.sub[data-state="active"] .pat`); got != "orders.*" {
			t.Fatalf("active subscription shows pattern %q, want orders.*", got)
		}

		// From outside, straight into NATS. customers.1, which orders.*
		// does not match, goes first on the same connection: the full log
		// is checked below.
		e.publish("customers.1", `{"id":1}`)
		e.publish("orders.42", `{"id":42,"status":"paid"}`)
		p.WaitVisible(`#events .event[data-subject="orders.42"]`)
		if got := p.Text(`#events .event[data-subject="orders.42"]`); !strings.Contains(got, "paid") || !strings.Contains(got, "subs: s1") {
			t.Fatalf("orders.42 entry reads %q, want its data (paid) and subs: s1", got)
		}

		// From the page's own publish form, through /api/publish.
		p.TypeInto("#pub-subject", "orders.7")
		p.TypeInto("#pub-data", `{"id":7}`)
		p.Click("#publish")
		p.WaitVisible(`#pub-result[data-ok="true"]`)
		if got := p.Text("#pub-result"); !strings.HasPrefix(got, "200 ") || !strings.Contains(got, `"published": 1`) {
			t.Fatalf("publish result reads %q, want 200 and published: 1", got)
		}
		p.WaitVisible(`#events .event[data-subject="orders.7"]`)
		if got := p.Text(`#events .event[data-subject="orders.7"]`); !strings.Contains(got, `"id": 7`) {
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
		p.WaitVisible(fmt.Sprintf(`#events .event[data-subject="orders.b%d"]`, burst-1))
		var want []string
		for i := burst - 1; i >= 0; i-- {
			want = append(want, fmt.Sprintf("orders.b%d", i))
		}
		want = append(want, "orders.7", "orders.42") // and no customers.1
		if got := eventSubjects(t, p); !slices.Equal(got, want) {
			t.Fatalf("event log shows subjects %q, want %q", got, want)
		}
		n := strconv.Itoa(len(want))
		if got := p.Text("#count"); got != n {
			t.Fatalf("event counter shows %q, want %s", got, n)
		}
		if got := p.Text(`#subs li.sub[data-state="active"] .st`); !strings.HasPrefix(got, n+" ev") {
			t.Fatalf("subscription counter shows %q, want %s ev", got, n)
		}
	})

	t.Run("server errors", func(t *testing.T) {
		p := openConsole(t, browser, e.http.URL)
		connected := p.Text("#status") // "connected · <connection id>"

		// A pattern the server refuses: the sub turns to error with the
		// code, and the log shows the error with its message.
		p.TypeInto("#pattern", "orders..x")
		p.Click("#subscribe")
		p.WaitVisible(`#subs li.sub[data-id="s1"][data-state="error"]`)
		if got := p.Text(`#subs li.sub[data-id="s1"] .st`); got != "bad_pattern" {
			t.Fatalf("refused subscription shows %q, want bad_pattern", got)
		}
		p.WaitVisible(`#events .entry.error`)
		if got := p.Text(`#events .entry.error`); !strings.Contains(got, "bad_pattern") ||
			!strings.Contains(got, "id: s1") || !strings.Contains(got, "empty token") {
			t.Fatalf("error entry reads %q, want the code, the id and the server's message", got)
		}
		// A refused subscription costs neither the connection nor the
		// next subscription.
		p.TypeInto("#pattern", "orders.*")
		p.Click("#subscribe")
		p.WaitVisible(`#subs li.sub[data-id="s2"][data-state="active"]`)
		if got := p.Text("#status"); got != connected {
			t.Fatalf("status reads %q after the error, want %q (the same connection)", got, connected)
		}

		// A publish the server refuses shows its status and error body.
		p.TypeInto("#pub-subject", "orders..x")
		p.Click("#publish")
		p.WaitVisible(`#pub-result[data-ok="false"]`)
		if got := p.Text("#pub-result"); !strings.HasPrefix(got, "400 ") || !strings.Contains(got, "empty token") {
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
	browser := browsertest.Start(t) // closed before the gateway: cleanups run last-in first-out

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
		openView(t, p, "orders.*", "doc.status == 'open'")
		p.WaitVisible(`#view-status[data-state="synced"]`)
		if got, want := p.Text("#view-status"), "synced at "+synced; got != want {
			t.Fatalf("view status reads %q, want %q", got, want)
		}
		// Complete at synced: no waiting for these rows. Sorted by
		// subject, orders.10 after orders.3.
		checkRows(t, p,
			"orders.1 id=1 status=open total=6",
			"orders.3 id=3 status=open total=9",
			"orders.10 id=10 status=open total=1.5",
		)
		if got := p.Text("#view-count"); got != "3" {
			t.Fatalf("row count reads %q, want 3", got)
		}

		// Live. An update in place changes the cells of the same row
		// (marked here: a re-rendered table would lose the mark).
		p.Do(chromedp.Evaluate[chromedp.Void](`document.querySelector('#view-body tr[data-key="orders.3"]').marked = true`))
		e.store("orders.3", row("update", 3, `{"id":3,"status":"open","total":12}`))
		waitRows(t, p,
			"orders.1 id=1 status=open total=6",
			"orders.3 id=3 status=open total=12",
			"orders.10 id=10 status=open total=1.5",
		)
		if marked, err := chromedp.Run(p.Context(), chromedp.Evaluate[bool](
			`document.querySelector('#view-body tr[data-key="orders.3"]').marked === true`)); err != nil || !marked {
			t.Fatalf("orders.3's row was replaced, not updated in place (marked %v, %v)", marked, err)
		}
		// An update into the filter adds a row, in its place.
		e.store("orders.2", row("update", 2, `{"id":2,"status":"open","total":7}`))
		waitRows(t, p,
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
		waitRows(t, p,
			"orders.2 id=2 status=open total=7",
			"orders.3 id=3 status=open total=12",
			"orders.5 id=5 status=open total=3 note=rush",
		)
		// A truncate of the table empties the view; later rows come back.
		e.store("orders.%truncate", `{"op":"truncate","key":null,"doc":null}`)
		waitRows(t, p)
		p.WaitVisible("#view-empty")
		e.store("orders.6", row("insert", 6, `{"id":6,"status":"open","total":4}`))
		waitRows(t, p, "orders.6 id=6 status=open total=4")
		if got := p.Text("#view-count"); got != "1" {
			t.Fatalf("row count reads %q, want 1", got)
		}
		if got, want := p.Text("#view-status"), "synced at "+synced; got != want {
			t.Fatalf("view status reads %q after live changes, want %q", got, want)
		}

		// Another view replaces it. Without a where the snapshot holds
		// every subject's newest event: the truncate removes the
		// documents before it, a delete is no row, orders.6 stays.
		synced = e.store("orders.7", row("insert", 7, `{"id":7,"status":"closed","total":8}`))
		openView(t, p, "orders.*", "")
		p.WaitVisible(`#view-status[data-state="synced"]`)
		if got, want := p.Text("#view-status"), "synced at "+synced; got != want {
			t.Fatalf("the second view's status reads %q, want %q", got, want)
		}
		checkRows(t, p,
			"orders.6 id=6 status=open total=4",
			"orders.7 id=7 status=closed total=8",
		)
		if got := p.Text("#view-title"); got != "orders.*" {
			t.Fatalf("view title reads %q, want orders.*", got)
		}
		// Unfiltered, a delete arrives as the event itself.
		e.store("orders.6", row("delete", 6, ""))
		waitRows(t, p, "orders.7 id=7 status=closed total=8")

		// Nothing failed on the way, in the page's callbacks either
		// (fanwire.js reports those as errors, which the log shows).
		if n, err := chromedp.Run(p.Context(), chromedp.Evaluate[int](`document.querySelectorAll("#events .entry.error").length`)); err != nil || n != 0 {
			t.Fatalf("the event log shows %d errors (%v), want none", n, err)
		}
	})

	t.Run("bad where", func(t *testing.T) {
		p := openConsole(t, browser, e.http.URL)
		openView(t, p, "orders.*", "doc.status ==")
		p.WaitVisible(`#view-status[data-state="error"]`)
		if got := p.Text("#view-status"); !strings.HasPrefix(got, "bad_filter: ") || !strings.Contains(got, "1:14") {
			t.Fatalf("view status reads %q, want bad_filter and the position (1:14)", got)
		}
		checkRows(t, p)
		// The connection stays: a good where opens.
		openView(t, p, "orders.*", "doc.total > 100")
		p.WaitVisible(`#view-status[data-state="synced"]`)
		checkRows(t, p)
		p.WaitVisible("#view-empty")
	})

	t.Run("too large", func(t *testing.T) {
		e := newEnvOn(t, "jetstream", func(c *gateway.Config) { c.MaxSnapshot = 2 })
		for i := 1; i <= 3; i++ {
			e.store("orders."+strconv.Itoa(i), row("insert", i, `{"id":`+strconv.Itoa(i)+`}`))
		}
		p := openConsole(t, browser, e.http.URL)
		openView(t, p, "orders.*", "")
		p.WaitVisible(`#view-status[data-state="error"]`)
		if got := p.Text("#view-status"); !strings.HasPrefix(got, "view_too_large: ") || !strings.Contains(got, "--max-snapshot") {
			t.Fatalf("view status reads %q, want view_too_large naming --max-snapshot", got)
		}
		checkRows(t, p) // an incomplete view is not shown
	})

	t.Run("core nats", func(t *testing.T) {
		e := newEnv(t, nil)
		p := openConsole(t, browser, e.http.URL)
		openView(t, p, "orders.*", "")
		p.WaitVisible(`#view-status[data-state="error"]`)
		if got := p.Text("#view-status"); !strings.HasPrefix(got, "bad_cursor: ") || !strings.Contains(got, "keeps no history") ||
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
func openView(t testing.TB, p *browsertest.Page, pattern, where string) {
	t.Helper()
	p.TypeInto("#view-pattern", pattern)
	p.TypeInto("#view-where", where)
	p.Click("#open-view")
}

// checkRows fails the test unless the view table shows want now.
func checkRows(t testing.TB, p *browsertest.Page, want ...string) {
	t.Helper()
	got := browsertest.Eval[[]string](p, "("+viewRowsJS+")()")
	if !slices.Equal(got, want) {
		t.Fatalf("view table shows\n  %s\nwant\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
}

// waitRows waits until the view table shows want, checking on every change
// of the page.
func waitRows(t testing.TB, p *browsertest.Page, want ...string) {
	t.Helper()
	if want == nil {
		want = []string{}
	}
	js, err := json.Marshal(want)
	if err != nil {
		t.Fatal(err)
	}
	p.WaitTrue("the view table to show "+string(js), "(want) => JSON.stringify(("+viewRowsJS+")()) === want", string(js))
}

// consoleState describes the console page for a failure.
const consoleState = `"status: " + document.getElementById("status").textContent +
		"\nsubs: " + document.getElementById("subs").innerText +
		"\npub-result: " + document.getElementById("pub-result").textContent +
		"\nview: " + document.getElementById("view-title").textContent +
		"\nview status: " + document.getElementById("view-status").textContent +
		"\nview table:\n" + document.getElementById("view-table").innerText +
		"\nevents:\n" + document.getElementById("events").innerText`

// openTab opens a blank tab in browser, every step in it bounded by
// consoleTimeout; state describes the page on a failure.
func openTab(t testing.TB, browser *browsertest.Browser, state string) *browsertest.Page {
	t.Helper()
	return browser.NewPage(t, browsertest.PageConfig{Timeout: consoleTimeout, State: state})
}

// openConsole opens the console at base+"/" in a new tab of browser and waits
// until its WebSocket is connected.
func openConsole(t *testing.T, browser *browsertest.Browser, base string) *browsertest.Page {
	t.Helper()
	p := openTab(t, browser, consoleState)
	p.Do(chromedp.Navigate(base + "/"))
	p.WaitVisible(`#status[data-state="connected"]`)
	return p
}

// eventSubjects returns the subjects of the event log's entries, newest first.
func eventSubjects(t testing.TB, p *browsertest.Page) []string {
	t.Helper()
	return browsertest.Eval[[]string](p, `Array.from(document.querySelectorAll("#events .event"), e => e.dataset.subject)`)
}

// TestConsolePresence: the console's Presence shows the members of a
// subject, live: a member tracked by another connection appears with its
// state, changes in place, and disappears when it untracks or its
// connection closes.
func TestConsolePresence(t *testing.T) {
	t.Parallel() // it mostly waits for its own processes (Node, Chromium, nodes): beside the others
	e := newEnv(t, presenceCfg(nil))
	browser := browsertest.Start(t) // closed before the gateway: cleanups run last-in first-out
	p := openConsole(t, browser, e.http.URL)
	p.TypeInto("#pres-subject", "room.1")
	p.Click("#show-members")
	p.WaitVisible(`#pres-status[data-state="synced"]`)
	p.WaitVisible(`#pres-empty`)
	if got := p.Text("#pres-count"); got != "0" {
		t.Fatalf("member count reads %q before anyone tracks, want 0", got)
	}

	a, b := e.dial(), e.dial()
	a.send(`{"type":"track","id":"t1","subject":"room.1","state":{"name":"ann"}}`)
	a.expect(map[string]any{"type": "tracked", "id": "t1"})
	row := func(c *client) string { return `#pres-body tr[data-conn="` + c.id + `"]` }
	p.WaitVisible(row(a))
	if got := p.Text(row(a)); !strings.Contains(got, a.id) || !strings.Contains(got, "(anonymous)") || !strings.Contains(got, `{"name":"ann"}`) {
		t.Fatalf("a's row reads %q, want its conn %s, (anonymous) and its state", got, a.id)
	}
	a.send(`{"type":"track","id":"t2","subject":"room.1","state":{"name":"ann","typing":true}}`)
	a.expect(map[string]any{"type": "tracked", "id": "t2"})
	p.WaitVisible(row(a) + `[data-state='{"name":"ann","typing":true}']`)
	if got := p.Text(row(a) + " td.state"); got != `{"name":"ann","typing":true}` {
		t.Fatalf("a's state reads %q after its update", got)
	}
	b.send(`{"type":"track","id":"t3","subject":"room.1"}`)
	b.expect(map[string]any{"type": "tracked", "id": "t3"})
	p.WaitVisible(row(b))
	if got := p.Text("#pres-count"); got != "2" {
		t.Fatalf("member count reads %q with a and b, want 2", got)
	}

	a.send(`{"type":"untrack","id":"u1","subject":"room.1"}`)
	a.expect(map[string]any{"type": "untracked", "id": "u1"})
	p.WaitGone(row(a))
	if got := p.Text("#pres-count"); got != "1" {
		t.Fatalf("member count reads %q after a untracked, want 1", got)
	}
	_ = b.c.CloseNow() // a closed connection leaves
	p.WaitGone(row(b))
	p.WaitVisible(`#pres-empty`)
	if got := p.Text("#pres-count"); got != "0" {
		t.Fatalf("member count reads %q after everyone left, want 0", got)
	}

	// The page tracks itself: it is listed with its state, by its
	// connection id, until it untracks.
	conn := strings.TrimPrefix(p.Text("#status"), "connected · ")
	p.TypeInto("#pres-state", `{"name": "me"}`)
	p.Click("#track")
	p.WaitVisible(`#tracks li[data-subject="room.1"][data-state="tracked"]`)
	if got, want := p.Text(`#tracks li[data-subject="room.1"] .st`), `as `+conn+` · {"name":"me"}`; got != want {
		t.Fatalf("the page's track reads %q, want %q", got, want)
	}
	self := `#pres-body tr[data-conn="` + conn + `"][data-state='{"name":"me"}']`
	p.WaitVisible(self)
	p.Click(`#tracks li[data-subject="room.1"] button.untrack`)
	p.WaitGone(self)
	p.WaitVisible(`#pres-empty`)
	if got := p.Text("#tracks"); got != "" {
		t.Fatalf("tracks read %q after the untrack, want none", got)
	}

	// A state that is not JSON is not sent.
	p.TypeInto("#pres-state", `{name}`)
	p.Click("#track")
	p.WaitVisible(`#tracks li[data-subject="room.1"][data-state="error"]`)
	if got := p.Text(`#tracks li[data-subject="room.1"] .st`); !strings.HasPrefix(got, "the state is not JSON") {
		t.Fatalf("a bad state reads %q", got)
	}
}
