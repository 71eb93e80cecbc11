package browsertest

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/chromedp/chromedp"
)

// Do runs the steps in the tab and fails the test with the page's state if
// one fails.
func (p *Page) Do(steps ...chromedp.Action[chromedp.Void]) {
	p.t.Helper()
	if err := chromedp.Do(p.ctx, steps...); err != nil {
		p.Fatal(err)
	}
}

// Eval returns the value of a script in the page.
func Eval[T any](p *Page, script string, opts ...chromedp.EvaluateOption) T {
	p.t.Helper()
	v, err := chromedp.Run(p.ctx, chromedp.Evaluate[T](script, opts...))
	if err != nil {
		p.Fatal(err)
	}
	return v
}

// WaitVisible waits until the first element matching the CSS selector sel
// is visible.
func (p *Page) WaitVisible(sel string) {
	p.t.Helper()
	if err := chromedp.Do(p.ctx, chromedp.WaitVisible(chromedp.CSS(sel))); err != nil {
		p.Fatal(fmt.Errorf("waiting for %s: %w", sel, err))
	}
}

// WaitGone waits until no element matches the CSS selector sel.
func (p *Page) WaitGone(sel string) {
	p.t.Helper()
	if err := chromedp.Do(p.ctx, chromedp.WaitNotPresent(chromedp.CSS(sel))); err != nil {
		p.Fatal(fmt.Errorf("waiting for %s to go: %w", sel, err))
	}
}

// WaitTrue waits until the script fn, a function called with the string
// arg, returns true, checking on every change of the page. what names the
// wait in a failure.
func (p *Page) WaitTrue(what, fn, arg string) {
	p.t.Helper()
	if err := chromedp.Do(p.ctx, chromedp.PollFunction[chromedp.Void](fn,
		chromedp.WithPollingMutation(), chromedp.WithPollingTimeout(0), chromedp.WithPollingArgs(arg),
	)); err != nil {
		p.Fatal(fmt.Errorf("waiting for %s: %w", what, err))
	}
}

// TypeInto replaces the value of an input or a textarea by typing, as a
// user does: clear, focus (a field may select its text on focus), keys.
//
// The field is cleared with a script: chromedp v0.23.0's SetValue(sel, "")
// fails ("could not set value"), because it passes "" as a call argument
// that json v2's omitempty drops, so the page receives undefined. Clear
// sets the value attribute, which an input ignores once it has been edited.
func (p *Page) TypeInto(sel, text string) {
	p.t.Helper()
	p.Do(
		chromedp.WaitVisible(chromedp.CSS(sel)),
		chromedp.Evaluate[chromedp.Void]("document.querySelector("+strconv.Quote(sel)+").value = ''"),
		chromedp.SendKeys(chromedp.CSS(sel), text),
	)
	got, err := chromedp.Run(p.ctx, chromedp.Value(chromedp.CSS(sel)))
	if err != nil {
		p.Fatal(err)
	}
	if got != text {
		p.t.Fatalf("%s%s holds %q after typing %q", p.cfg.prefix(), sel, got, text)
	}
}

// Click clicks the first element matching the CSS selector sel, once it is
// visible.
func (p *Page) Click(sel string) {
	p.t.Helper()
	p.Do(chromedp.Click(chromedp.CSS(sel)))
}

// Text returns the rendered text of the first element matching the CSS
// selector sel, trimmed.
func (p *Page) Text(sel string) string {
	p.t.Helper()
	s, err := chromedp.Run(p.ctx, chromedp.Text(chromedp.CSS(sel)))
	if err != nil {
		p.Fatal(err)
	}
	return strings.TrimSpace(s)
}
