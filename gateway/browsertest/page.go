package browsertest

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// fatalReadTimeout bounds reading the page's state for a failure.
const fatalReadTimeout = 2 * time.Second

// Page is one tab of a Browser.
type Page struct {
	t     testing.TB      // static after NewPage
	cfg   PageConfig      // static after NewPage
	tab   context.Context // the tab; it outlives ctx so a failure can still read the page
	ctx   context.Context // every step, bounded by cfg.Timeout together
	close func()          // closes the tab once; static after NewPage

	mu       sync.Mutex
	messages []chromedp.ConsoleMessage // the page's console, guarded by mu
}

// NewPage opens a blank tab in b. Every step in the tab fails after
// cfg.Timeout, all steps together. The tab is closed by Close or t's
// cleanup, which fails the test on any uncaught exception in the page and,
// if the test failed, logs the page's console.
func (b *Browser) NewPage(t testing.TB, cfg PageConfig) *Page {
	t.Helper()
	if cfg.Timeout <= 0 {
		t.Fatalf("browsertest: PageConfig.Timeout is %v, want a positive duration", cfg.Timeout)
	}
	// The tab's own life has a deadline too (its first Run binds it), a
	// little past the steps' so that a failure can still read the page.
	life, endLife := context.WithTimeout(b.ctx, cfg.Timeout+5*time.Second)
	tab, closeTab := chromedp.NewContext(life)
	ctx, cancelSteps := context.WithTimeout(tab, cfg.Timeout)
	p := &Page{t: t, cfg: cfg, tab: tab, ctx: ctx}

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
				t.Errorf("%s threw: %s", cfg.label(), m)
			} else if t.Failed() {
				t.Logf("%s console: %s (%s)", cfg.label(), m, m.URL)
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

// Close closes the tab, as a user does, and waits for it. It is idempotent;
// the page's cleanup still checks what the page logged.
func (p *Page) Close() { p.close() }

// Context is the context of the page's steps, bounded by its timeout, for
// chromedp calls the Page has no method for.
func (p *Page) Context() context.Context { return p.ctx }

// Fatal fails the test with err and what the page's state script says,
// read on the tab with a short deadline of its own: the steps' context may
// be the one that expired.
func (p *Page) Fatal(err error) {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(p.tab, fatalReadTimeout)
	defer cancel()
	state, serr := chromedp.Run(ctx, chromedp.Evaluate[string](p.cfg.State))
	if serr != nil {
		state = "(unavailable: " + serr.Error() + ")"
	}
	p.t.Fatalf("%s%v\n--- page ---\n%s", p.cfg.prefix(), err, state)
}
