package gateway

import (
	"testing"
	"time"

	"github.com/fanwire/fanwire/gateway/auth"
	"github.com/fanwire/fanwire/gateway/internal/fanout"
)

// TestLateCloseAfterTheConnectionEnded: a timer callback that runs after the
// connection ended (the token's expiry, GraphQL's init timeout: serve's Stop
// comes too late once the callback has started) finds it closed, requests
// no close and arms no close watchdog, which nothing would stop.
func TestLateCloseAfterTheConnectionEnded(t *testing.T) {
	c := &conn{s: &Server{cfg: Config{CloseTimeout: time.Hour}}}
	c.cl = fanout.NewClient(16, 1<<20, c.overflow)
	c.grants = &auth.Grants{Expires: time.Now().Add(time.Hour)}
	c.armExpiry()
	// serve's end, as it marks the connection closed and stops its timers.
	c.mu.Lock()
	c.closed = true
	c.expiry.Stop()
	c.mu.Unlock()
	// What the expiry's and the init timeout's callbacks run, late.
	c.closeWith(CloseTokenExpired, "token expired: reconnect with a new one")
	c.closeWith(CloseInitTimeout, "Connection initialisation timeout")
	c.mu.Lock()
	w := c.watchdog
	c.mu.Unlock()
	if w != nil {
		w.Stop()
		t.Error("a close watchdog was armed on a connection that had ended")
	}
	if code := c.closeCode.Load(); code != 0 {
		t.Errorf("close %d requested on a connection that had ended", code)
	}
}
