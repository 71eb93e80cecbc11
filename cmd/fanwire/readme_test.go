package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/fanwire/fanwire/cdc/pgtest"
	"github.com/fanwire/fanwire/gateway/browsertest"
)

// TestReadmeWalkthrough follows README.md's "Try it" section, "Your
// database, live" included, as a newcomer does: the README is the
// script, read when the test runs, so the two cannot drift apart.
//
// It walks the section in order. Each sh block's commands run as written,
// one line at a time, in a directory of the test's own (so ./.fanwire is
// there), with three substitutions: the binary built from this tree
// stands for `go run ./cmd/fanwire`; 127.0.0.1:8080 and 127.0.0.1:5432
// become the free ports of the test's gateway and PostgreSQL (the first
// also through FANWIRE_LISTEN, the second through PGHOST, PGPORT and
// PGUSER for psql and createdb). A `fanwire dev` line starts the process
// and waits until it is ready, stopping the one before with SIGINT, as the
// README's Ctrl-C does; any other line must exit 0. The block marked
// "walkthrough: banner" must be the start of dev's banner, and "walkthrough:
// view table" what the console's View table shows ("…" matches anything).
// The sentences walkthrough.steps knows drive the console in Chromium and
// check what the README says the user sees; each must be found, so a
// reworded step fails here until the test learns the new wording.
func TestReadmeWalkthrough(t *testing.T) {
	w := &walkthrough{t: t, bin: buildBinary(t), dir: t.TempDir(), listen: listenAddr(t)}
	pg := pgtest.Start(t, pgtest.Config{})
	w.pgAddr = fmt.Sprintf("127.0.0.1:%d", pg.Port())
	w.env = []string{"FANWIRE_LISTEN=" + w.listen, "PGHOST=127.0.0.1", "PGPORT=" + strconv.Itoa(pg.Port()), "PGUSER=postgres"}
	w.browser = browsertest.Start(t)
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	chunks := walkthroughChunks(t, string(readme))
	steps := w.steps()
	used := map[string]bool{}
	start := time.Now()
	for _, c := range chunks {
		switch {
		case c.code && c.lang == "sh":
			for i, line := range strings.Split(c.text, "\n") {
				if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
					w.run(c.line+1+i, line)
				}
			}
		case c.code && c.marker == "banner":
			w.checkBanner(c)
			used["banner"] = true
		case c.code && c.marker == "view table":
			w.checkViewTable(c)
			used["view table"] = true
		case !c.code:
			for _, s := range steps {
				if m := s.re.FindStringSubmatch(c.text); m != nil {
					t.Logf("README.md:%d: %s", c.line, s.name)
					s.do(m)
					used[s.name] = true
				}
			}
		}
	}
	if w.dev != nil {
		w.dev.interrupt() // Ctrl-C: dev drains and exits 0
	}
	for _, name := range append([]string{"banner", "view table"}, stepNames(steps)...) {
		if !used[name] {
			t.Errorf("README.md's walkthrough no longer has the step %q: update it or this test", name)
		}
	}
	t.Logf("the walkthrough took %v", time.Since(start).Round(time.Millisecond))
}

// walkthroughTimeout bounds every browser step of the walkthrough together.
const walkthroughTimeout = 60 * time.Second

// consolePageState describes the console page for a failure.
const consolePageState = `"status: " + document.getElementById("status").textContent +
	"\nsubs: " + document.getElementById("subs").innerText +
	"\npub-result: " + document.getElementById("pub-result").textContent +
	"\ntracks: " + document.getElementById("tracks").innerText +
	"\nmembers of " + document.getElementById("pres-title").textContent + " (" + document.getElementById("pres-status").textContent + "):\n" + document.getElementById("pres-body").innerText +
	"\nview: " + document.getElementById("view-title").textContent +
	"\nview status: " + document.getElementById("view-status").textContent +
	"\nview table:\n" + document.getElementById("view-table").innerText +
	"\nevents:\n" + document.getElementById("events").innerText`

// openConsole opens url in a new tab of browser, named name in failures,
// and waits until the console is connected. Every step in the tab fails
// after walkthroughTimeout; the tab is closed by Close or the test's
// cleanup, which fails the test on any uncaught exception in the page.
func openConsole(t testing.TB, browser *browsertest.Browser, name, url string) *browsertest.Page {
	t.Helper()
	p := browser.NewPage(t, browsertest.PageConfig{Timeout: walkthroughTimeout, State: consolePageState, Name: name})
	p.Do(chromedp.Navigate(url))
	p.WaitVisible(`#status[data-state="connected"]`)
	return p
}

// walkthrough is the state of TestReadmeWalkthrough as it follows the README.
type walkthrough struct {
	t       *testing.T
	bin     string   // the fanwire built from this tree
	dir     string   // the working directory of every command
	listen  string   // the gateway's address: 127.0.0.1:8080 in the README
	pgAddr  string   // PostgreSQL's: 127.0.0.1:5432 in the README
	env     []string // added to every command's environment
	browser *browsertest.Browser

	dev     *devProc          // the running `fanwire dev`
	output  string            // the last command's standard output
	console *browsertest.Page // the console the README has the user open first
	conn    string            // its connection id before dev restarted
}

// step is a sentence of the README's walkthrough the test acts on: re
// matches it (a paragraph or a list item, its lines joined), do acts with
// the submatches.
type step struct {
	name string
	re   *regexp.Regexp
	do   func(m []string)
}

func stepNames(steps []step) []string {
	var names []string
	for _, s := range steps {
		names = append(names, s.name)
	}
	return names
}

// steps are what the test understands of the README's prose.
func (w *walkthrough) steps() []step {
	t := w.t
	return []step{
		{"curl's answer", regexp.MustCompile("^It answers `([^`]+)`"), func(m []string) {
			if w.output != m[1] {
				t.Fatalf("the command answered %q, the README says %q", w.output, m[1])
			}
		}},
		{"open the console", regexp.MustCompile(`^Open http://127\.0\.0\.1:8080 for the live console`), func([]string) {
			w.console = openConsole(t, w.browser, "the console", "http://"+w.listen+"/")
			w.conn = strings.TrimPrefix(w.console.Text("#status"), "connected · ")
		}},
		{"subscribe", regexp.MustCompile("\\*\\*Subscribe\\*\\* to `([^`]+)`(?: from `([^`]+)`)?(?:: `([^`]+)` arrives with `([^`]+)` and cursor `([^`]+)`)?"), func(m []string) {
			p := w.console
			p.TypeInto("#pattern", m[1])
			p.TypeInto("#from", m[2])
			p.Click("#subscribe")
			p.WaitTrue("the subscription to "+m[1]+" to be active",
				`(pattern) => [...document.querySelectorAll('#subs li.sub[data-state="active"] .pat')].some((e) => e.textContent === pattern)`, m[1])
			if m[3] != "" {
				w.waitEvent(m[3], m[4], m[5])
			}
		}},
		{"publish", regexp.MustCompile("\\*\\*Publish\\*\\* `([^`]+)` with `([^`]+)` from the page: it answers `([^`]+)` with cursor `([^`]+)`, and the event arrives in the log"), func(m []string) {
			p := w.console
			p.TypeInto("#pub-subject", m[1])
			p.TypeInto("#pub-data", m[2])
			p.Click("#publish")
			p.WaitVisible(`#pub-result[data-ok]`)
			if got := p.Text("#pub-result"); !strings.HasPrefix(got, m[3]+"\n") || !strings.Contains(got, strconv.Quote(m[4])) {
				t.Fatalf("the publish form shows %q, the README says %s with cursor %s", got, m[3], m[4])
			}
			w.waitEvent(m[1], m[2], m[4])
		}},
		{"presence", regexp.MustCompile("\\*\\*Presence\\*\\*: open the console in a second tab and track it on `([^`]+)` with `([^`]+)` \\(\\*\\*Track this page\\*\\*\\)\\. Back in the first tab, \\*\\*Show members\\*\\* of `([^`]+)`: the second tab is listed, with its state\\. Close the second tab, and it leaves\\."), func(m []string) {
			second := openConsole(t, w.browser, "the second tab", "http://"+w.listen+"/")
			second.TypeInto("#pres-subject", m[1])
			second.TypeInto("#pres-state", m[2])
			second.Click("#track")
			second.WaitVisible(`#tracks li[data-state="tracked"]`)
			conn := strings.TrimPrefix(second.Text("#status"), "connected · ")
			p := w.console
			p.TypeInto("#pres-subject", m[3])
			p.Click("#show-members")
			state, _ := json.Marshal(json.RawMessage(m[2])) // compact, as the table shows it
			member := `#pres-body tr[data-conn="` + conn + `"][data-state='` + string(state) + `']`
			p.WaitVisible(member)
			second.Close()
			p.WaitGone(member)
		}},
		{"dev restarted", regexp.MustCompile("The console, still open, reconnects by itself and resumes `([^`]+)` from its last event: nothing missed, nothing twice\\."), func(m []string) {
			p := w.console
			p.WaitTrue("a new connection", `(old) => { const s = document.getElementById("status"); return s.dataset.state === "connected" && !s.textContent.endsWith(old); }`, w.conn)
			p.WaitTrue("the subscription to "+m[1]+" to be active again",
				`(pattern) => [...document.querySelectorAll('#subs li.sub[data-state="active"] .pat')].some((e) => e.textContent === pattern)`, m[1])
			// A presence room lists its members again on a new
			// connection (and says so); the subscription resumes.
			if got := browsertest.Eval[string](p, `document.getElementById("events").innerText`); strings.Contains(got, "("+m[1]+"): events may have been missed") {
				t.Fatalf("the console reports a gap in %s after dev restarted:\n%s", m[1], got)
			}
		}},
		{"view", regexp.MustCompile("\\*\\*View\\*\\* `([^`]+)` where `([^`]+)`: .* The status line says `([^`]+)` once the snapshot is complete"), func(m []string) {
			p := w.console
			p.TypeInto("#view-pattern", m[1])
			p.TypeInto("#view-where", m[2])
			p.Click("#open-view")
			p.WaitVisible(`#view-status[data-state="synced"]`)
			if got := p.Text("#view-status"); !wildcard(m[3]).MatchString(got) {
				t.Fatalf("the view's status line reads %q, the README says %q", got, m[3])
			}
		}},
		{"insert", regexp.MustCompile("^The view gets a row for `([^`]+)`, and the event log its insert\\."), func(m []string) {
			w.console.WaitVisible(`#view-body tr[data-key="` + m[1] + `"]`)
			w.waitIngestEvent(m[1], "insert")
		}},
		{"update", regexp.MustCompile("^`([^`]+)` leaves the view, since it no longer passes the where, and the update arrives in the event log, on `([^`]+)`: `([^`]+)`"), func(m []string) {
			w.console.WaitGone(`#view-body tr[data-key="` + m[1] + `"]`)
			got := w.waitIngestEvent(m[2], "update")
			var want map[string]any
			if err := json.Unmarshal([]byte(m[3]), &want); err != nil {
				t.Fatalf("the README's event %s: %v", m[3], err)
			}
			if err := matchEvent(want, got); err != nil {
				t.Fatalf("the update event %v does not read as the README's %s: %v", got, m[3], err)
			}
		}},
	}
}

// run runs one command line of the README (at README.md:line).
func (w *walkthrough) run(line int, cmd string) {
	t := w.t
	t.Helper()
	cmd = strings.ReplaceAll(cmd, "go run ./cmd/fanwire", w.bin)
	cmd = strings.ReplaceAll(cmd, "127.0.0.1:8080", w.listen)
	cmd = strings.ReplaceAll(cmd, "127.0.0.1:5432", w.pgAddr)
	t.Logf("README.md:%d: $ %s", line, cmd)
	if strings.HasPrefix(cmd, w.bin+" dev") {
		if w.dev != nil {
			w.dev.interrupt()
		}
		w.dev = startDev(t, w.dir, w.env, w.listen, cmd)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := exec.CommandContext(ctx, "sh", "-c", cmd)
	c.Dir = w.dir
	c.Env = append(os.Environ(), w.env...)
	var stdout, stderr bytes.Buffer
	c.Stdout, c.Stderr = &stdout, &stderr
	if err := c.Run(); err != nil {
		t.Fatalf("README.md:%d: %s: %v\n%s%s", line, cmd, err, stdout.String(), stderr.String())
	}
	w.output = strings.TrimSpace(stdout.String())
}

// checkBanner checks that the running dev's banner starts with the lines
// of the README's block c.
func (w *walkthrough) checkBanner(c mdChunk) {
	w.t.Helper()
	got := strings.Split(w.dev.banner(), "\n")
	want := strings.Split(strings.ReplaceAll(c.text, "127.0.0.1:8080", w.listen), "\n")
	for i, line := range want {
		if i >= len(got) || !wildcard(line).MatchString(got[i]) {
			w.t.Fatalf("README.md:%d: dev's banner reads\n%s\nthe README says\n%s", c.line, strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
	}
}

// checkViewTable waits until the console's View table reads as the
// README's block c: its lines, cells separated by blanks.
func (w *walkthrough) checkViewTable(c mdChunk) {
	var want []string
	for _, line := range strings.Split(c.text, "\n") {
		want = append(want, strings.Join(strings.Fields(line), " "))
	}
	js, _ := json.Marshal(want)
	w.console.WaitTrue("the view table to read "+string(js),
		`(want) => JSON.stringify([...document.querySelectorAll("#view-table tr")].map((tr) =>
			[...tr.children].map((c) => c.textContent.trim()).filter((s) => s !== "").join(" "))) === want`, string(js))
}

// waitEvent waits until the console's event log holds an event on
// subject with data (as JSON, whatever its layout) and cursor.
func (w *walkthrough) waitEvent(subject, data, cursor string) {
	w.t.Helper()
	arg, _ := json.Marshal(map[string]string{"subject": subject, "data": data, "cursor": cursor})
	w.console.WaitTrue(fmt.Sprintf("an event on %s with %s and cursor %s", subject, data, cursor),
		`(arg) => { const want = JSON.parse(arg);
			return [...document.querySelectorAll("#events .event")].some((e) => e.dataset.subject === want.subject &&
				[...e.querySelectorAll(".tag")].some((t) => t.textContent === "cursor: " + want.cursor) &&
				JSON.stringify(JSON.parse(e.querySelector("pre.data").textContent)) === JSON.stringify(JSON.parse(want.data))); }`,
		string(arg))
}

// waitIngestEvent waits until the console's event log holds an event of
// the ingest on subject with op, and returns its data.
func (w *walkthrough) waitIngestEvent(subject, op string) map[string]any {
	w.t.Helper()
	arg, _ := json.Marshal(map[string]string{"subject": subject, "op": op})
	find := `(arg) => { const want = JSON.parse(arg);
		return [...document.querySelectorAll("#events .event")].find((e) => e.dataset.subject === want.subject &&
			JSON.parse(e.querySelector("pre.data").textContent).op === want.op); }`
	w.console.WaitTrue("an "+op+" event on "+subject, "(arg) => ("+find+")(arg) !== undefined", string(arg))
	text := browsertest.Eval[string](w.console, "("+find+")("+strconv.Quote(string(arg))+").querySelector('pre.data').textContent")
	var data map[string]any
	if err := json.Unmarshal([]byte(text), &data); err != nil {
		w.t.Fatalf("event data %q: %v", text, err)
	}
	return data
}

// lsnPattern is a PostgreSQL LSN as the ingest writes it.
var lsnPattern = regexp.MustCompile(`^[0-9A-F]+/[0-9A-F]+$`)

// matchEvent reports how an ingest event differs from the README's:
// the same fields, "…" standing for any value, and the README's example
// LSN for any LSN.
func matchEvent(want, got map[string]any) error {
	for k, v := range want {
		g, ok := got[k]
		switch {
		case !ok:
			return fmt.Errorf("no %q", k)
		case v == "…":
		case k == "lsn":
			if s, _ := g.(string); !lsnPattern.MatchString(s) {
				return fmt.Errorf("lsn %v is not an LSN", g)
			}
		case !reflect.DeepEqual(v, g):
			return fmt.Errorf("%q is %v, not %v", k, g, v)
		}
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			return fmt.Errorf("%q, which the README does not show", k)
		}
	}
	return nil
}

// wildcard matches a whole line, "…" standing for any run of characters.
func wildcard(pattern string) *regexp.Regexp {
	parts := strings.Split(pattern, "…")
	for i, p := range parts {
		parts[i] = regexp.QuoteMeta(p)
	}
	return regexp.MustCompile("^" + strings.Join(parts, ".*") + "$")
}

// mdChunk is a piece of the README's walkthrough: a fenced code block, or
// a paragraph or list item of prose (its lines joined by spaces).
type mdChunk struct {
	line   int  // where it starts in README.md
	code   bool // a fenced block
	lang   string
	marker string // a code block's "<!-- walkthrough: marker -->" before it
	text   string
}

// listItem starts an ordered list's item.
var listItem = regexp.MustCompile(`^\d+\. `)

// walkthroughChunks splits README.md's section "## Try it…", up to the
// next "## ", into chunks. HTML comments other than markers are skipped.
func walkthroughChunks(t *testing.T, readme string) []mdChunk {
	t.Helper()
	lines := strings.Split(readme, "\n")
	var chunks []mdChunk
	var para []string
	paraLine, marker := 0, ""
	flush := func() {
		if len(para) > 0 {
			chunks = append(chunks, mdChunk{line: paraLine, text: strings.Join(para, " ")})
			para = nil
		}
	}
	in := false
	for i := 0; i < len(lines); i++ {
		l := lines[i]
		if strings.HasPrefix(l, "## ") {
			if in {
				break
			}
			in = strings.HasPrefix(l, "## Try it")
			continue
		}
		if !in {
			continue
		}
		switch {
		case strings.HasPrefix(l, "```"):
			flush()
			c := mdChunk{line: i + 1, code: true, lang: strings.TrimPrefix(l, "```"), marker: marker}
			var body []string
			for i++; i < len(lines) && !strings.HasPrefix(lines[i], "```"); i++ {
				body = append(body, lines[i])
			}
			c.text = strings.Join(body, "\n")
			chunks = append(chunks, c)
			marker = ""
		case strings.HasPrefix(l, "<!-- walkthrough: "):
			flush()
			marker = strings.TrimSuffix(strings.TrimPrefix(l, "<!-- walkthrough: "), " -->")
		case strings.HasPrefix(l, "<!--"):
			flush()
			for ; i < len(lines) && !strings.Contains(lines[i], "-->"); i++ {
			}
		case strings.TrimSpace(l) == "" || strings.HasPrefix(l, "#"):
			flush()
		case listItem.MatchString(l):
			flush()
			paraLine, para = i+1, []string{listItem.ReplaceAllString(l, "")}
		default:
			if len(para) == 0 {
				paraLine = i + 1
			}
			para = append(para, strings.TrimSpace(l))
		}
	}
	if len(chunks) == 0 {
		t.Fatal(`README.md has no section "## Try it"`)
	}
	return chunks
}
