package browsertest

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"slices"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

const (
	// startTimeout bounds Chromium's start: ~3 s under -race on a 2-core
	// machine, so 30 s leaves room for a loaded CI runner.
	startTimeout = 30 * time.Second
	// closeTimeout bounds the graceful close; past it the process is killed.
	closeTimeout = 10 * time.Second
)

// Browser is one running headless Chromium.
type Browser struct {
	ctx context.Context // chromedp's browser context; static after Start
}

// Start starts one headless Chromium and returns it once it answers. Its
// cleanup closes the browser gracefully and returns only once the process
// has exited and chromedp's goroutines have ended.
func Start(t testing.TB) *Browser {
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
		cctx, ccancel := context.WithTimeout(ctx, closeTimeout)
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
	watchdog := time.AfterFunc(startTimeout, endLife)
	err := chromedp.Do(ctx)
	if !watchdog.Stop() {
		t.Fatalf("chromium did not start within %v: %v", startTimeout, err)
	}
	if err != nil {
		t.Fatalf("starting %s: %v", exe, err)
	}
	return &Browser{ctx: ctx}
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
