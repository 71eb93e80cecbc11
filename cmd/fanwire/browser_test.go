package main

import (
	"context"
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
)

// Headless Chromium for the tests that drive the console of a real
// process. gateway/console_test.go has the same helpers for its
// in-process gateway; a test package cannot share them.

// browserStartTimeout bounds Chromium's start (~3 s under -race on this
// 2-core machine); browserCloseTimeout its graceful close.
const (
	browserStartTimeout = 30 * time.Second
	browserCloseTimeout = 10 * time.Second
)

// startBrowser starts one headless Chromium; its cleanup closes it and
// returns once the process has exited. A missing browser fails the test.
func startBrowser(t testing.TB) context.Context {
	t.Helper()
	if testing.Short() {
		t.Skip("-short (make test-quick) leaves out the tests that start Chromium: make test runs them")
	}
	exe, err := exec.LookPath("chromium")
	if err != nil {
		exe = "/usr/bin/chromium"
		if _, err := os.Stat(exe); err != nil {
			t.Fatal("chromium not found (PATH, /usr/bin/chromium): run `make test`, which installs it, or `apt-get install chromium`")
		}
	}
	life, endLife := context.WithCancel(context.Background())
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(life, slices.Concat(
		chromedp.DefaultExecAllocatorOptions[:],
		[]chromedp.ExecAllocatorOption{
			chromedp.ExecPath(exe),
			chromedp.NoSandbox, // CI runs as root
			chromedp.DisableGPU,
			chromedp.Flag("disable-quic", true),
			chromedp.Flag("disable-component-update", true),
			chromedp.UserDataDir(t.TempDir()),
			chromedp.WindowSize(1280, 900),
		},
	)...)
	ctx, cancelBrowser := chromedp.NewContext(allocCtx)
	t.Cleanup(func() {
		cctx, ccancel := context.WithTimeout(ctx, browserCloseTimeout)
		defer ccancel()
		if err := chromedp.Cancel(cctx); err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("closing chromium: %v", err)
		}
		cancelBrowser()
		cancelAlloc()
		endLife()
	})
	// The first Run binds the browser's life to ctx, so it cannot carry a
	// deadline; the watchdog kills a start that hangs.
	watchdog := time.AfterFunc(browserStartTimeout, endLife)
	err = chromedp.Do(ctx)
	if !watchdog.Stop() {
		t.Fatalf("chromium did not start within %v: %v", browserStartTimeout, err)
	}
	if err != nil {
		t.Fatalf("starting %s: %v", exe, err)
	}
	return ctx
}

// consolePage is one tab of the browser on a console page.
type consolePage struct {
	t     testing.TB
	name  string          // for messages: "tab 1"
	tab   context.Context // the tab; it outlives ctx so a failure can still read the page
	ctx   context.Context // every step, bounded by the tab's timeout
	close func()          // closes the tab, as a user does

	mu       sync.Mutex
	messages []chromedp.ConsoleMessage // the page's console, guarded by mu
}

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

// openConsolePage opens url in a new tab of browser and waits until the
// console is connected. Every step in the tab fails after timeout; the
// tab is closed by close or the test's cleanup, which fails the test on
// any uncaught exception in the page.
func openConsolePage(t testing.TB, browser context.Context, name, url string, timeout time.Duration) *consolePage {
	t.Helper()
	life, endLife := context.WithTimeout(browser, timeout+5*time.Second)
	tab, closeTab := chromedp.NewContext(life)
	ctx, cancelSteps := context.WithTimeout(tab, timeout)
	p := &consolePage{t: t, name: name, tab: tab, ctx: ctx}
	var wg sync.WaitGroup
	var once sync.Once
	p.close = func() {
		once.Do(func() {
			cancelSteps()
			closeTab() // closes the tab and waits for it
			endLife()
			wg.Wait()
		})
	}
	t.Cleanup(func() {
		p.close()
		p.mu.Lock()
		defer p.mu.Unlock()
		for _, m := range p.messages {
			if m.IsException() {
				t.Errorf("%s threw: %s", name, m)
			} else if t.Failed() {
				t.Logf("%s console: %s (%s)", name, m, m.URL)
			}
		}
	})
	messages := chromedp.Console(tab) // subscribed before it returns: it sees the page's first script
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
	p.do(chromedp.Navigate(url))
	p.waitVisible(`#status[data-state="connected"]`)
	return p
}

// do runs the steps in the tab and fails the test with the page's state
// if one fails.
func (p *consolePage) do(steps ...chromedp.Action[chromedp.Void]) {
	p.t.Helper()
	if err := chromedp.Do(p.ctx, steps...); err != nil {
		p.fatal(err)
	}
}

func (p *consolePage) waitVisible(sel string) {
	p.t.Helper()
	if err := chromedp.Do(p.ctx, chromedp.WaitVisible(chromedp.CSS(sel))); err != nil {
		p.fatal(fmt.Errorf("waiting for %s: %w", sel, err))
	}
}

func (p *consolePage) waitGone(sel string) {
	p.t.Helper()
	if err := chromedp.Do(p.ctx, chromedp.WaitNotPresent(chromedp.CSS(sel))); err != nil {
		p.fatal(fmt.Errorf("waiting for %s to go: %w", sel, err))
	}
}

// waitTrue waits until the script fn, called with arg, returns true,
// checking on every change of the page.
func (p *consolePage) waitTrue(what, fn string, arg string) {
	p.t.Helper()
	if err := chromedp.Do(p.ctx, chromedp.PollFunction[chromedp.Void](fn,
		chromedp.WithPollingMutation(), chromedp.WithPollingTimeout(0), chromedp.WithPollingArgs(arg),
	)); err != nil {
		p.fatal(fmt.Errorf("waiting for %s: %w", what, err))
	}
}

// eval returns the value of a script.
func eval[T any](p *consolePage, script string) T {
	p.t.Helper()
	v, err := chromedp.Run(p.ctx, chromedp.Evaluate[T](script))
	if err != nil {
		p.fatal(err)
	}
	return v
}

// typeInto replaces the value of an input by typing, as a user does. The
// field is cleared with a script: chromedp v0.23.0's SetValue(sel, "")
// fails (gateway/console_test.go says why).
func (p *consolePage) typeInto(sel, text string) {
	p.t.Helper()
	p.do(
		chromedp.WaitVisible(chromedp.CSS(sel)),
		chromedp.Evaluate[chromedp.Void]("document.querySelector("+strconv.Quote(sel)+").value = ''"),
		chromedp.SendKeys(chromedp.CSS(sel), text),
	)
	if got := eval[string](p, "document.querySelector("+strconv.Quote(sel)+").value"); got != text {
		p.t.Fatalf("%s: %s holds %q after typing %q", p.name, sel, got, text)
	}
}

func (p *consolePage) click(sel string) {
	p.t.Helper()
	p.do(chromedp.Click(chromedp.CSS(sel)))
}

// text is the rendered text of the first element matching sel.
func (p *consolePage) text(sel string) string {
	p.t.Helper()
	s, err := chromedp.Run(p.ctx, chromedp.Text(chromedp.CSS(sel)))
	if err != nil {
		p.fatal(err)
	}
	return strings.TrimSpace(s)
}

// fatal fails the test with err and what the page shows, read with a
// deadline of its own: p.ctx may be the one that expired.
func (p *consolePage) fatal(err error) {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(p.tab, 2*time.Second)
	defer cancel()
	state, serr := chromedp.Run(ctx, chromedp.Evaluate[string](consolePageState))
	if serr != nil {
		state = "(unavailable: " + serr.Error() + ")"
	}
	p.t.Fatalf("%s: %v\n--- page ---\n%s", p.name, err, state)
}
