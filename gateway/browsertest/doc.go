// Package browsertest starts a headless Chromium and drives pages in it, for
// tests, the way net/http/httptest starts real HTTP servers: the gateway's
// pages (the console, fanwire.js, graphql-ws) in a real browser, over the
// DevTools protocol (chromedp).
//
// Start starts one browser for a test: Debian's chromium, found on PATH or at
// /usr/bin/chromium, with the flags a headless root on a closed network
// needs. A missing browser fails the test; it never skips, except under
// -short (make test-quick), which leaves the browser tests out.
//
// A Page is one tab. Every step in it is bounded by the page's timeout,
// together; its console is captured; an uncaught exception in it fails the
// test when the page closes; a failing step fails the test with what the
// page's state script says about it.
//
// Concurrency: the Browser owns the Chromium process, and the test that
// started it owns the Browser: its t.Cleanup closes the browser gracefully
// (killing it past a deadline) and returns only once the process has exited
// and chromedp's goroutines have ended. Open Pages with that test or one of
// its subtests, so that every page's cleanup runs before the browser's. A
// Page owns one goroutine, the collector of its console, which Close and the
// page's cleanup stop and wait for. A Page's methods fail the test with
// t.FailNow, so call them from the goroutine running the test that opened it.
package browsertest
