package gateway

import (
	"sync"
	"time"
)

// ForceGraphQLExecutor makes s serve every GraphQL subscription through
// gqlgen's executor, as it does the selections its fast path does not
// cover. Call it before any connection.
func ForceGraphQLExecutor(s *Server) { s.gqlExecutorOnly = true }

// IndexSize reports the subscriptions in s's index and the trie nodes that
// hold them (the root excluded): both return to zero when every
// subscription is gone, or the index leaks.
func IndexSize(s *Server) (subs, nodes int) {
	return s.hub.Size()
}

// SetFilterClock makes the filter budgets of a server made with c run by
// now instead of the wall clock.
func SetFilterClock(c *Config, now func() time.Time) { c.filterClock = now }

// PendingHandshakes reports the connections s's HTTPServer tracks as not
// yet past their first request (they must not outlive their connections).
func PendingHandshakes(s *Server) int {
	s.handshakes.mu.Lock()
	defer s.handshakes.mu.Unlock()
	return len(s.handshakes.pending)
}

// CheckCertFiles runs c's periodic check now, as a handshake after the
// check interval does.
func CheckCertFiles(c *CertFiles) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.reloadLocked()
}

// AdmissionClock is the connect rate's clock in a test: it stands still
// until Advance, so a test decides when the next token comes.
type AdmissionClock struct {
	mu     sync.Mutex
	now    time.Time               // guarded by mu
	timers map[*fakeTimer]struct{} // guarded by mu: not fired, not stopped
}

type fakeTimer struct {
	at time.Time      // static
	c  chan time.Time // buffered: one value
}

// FreezeAdmission gives s's connect rate a clock that stands still. Call it
// before any upgrade request.
func FreezeAdmission(s *Server) *AdmissionClock {
	c := &AdmissionClock{now: time.Unix(1_000_000_000, 0), timers: make(map[*fakeTimer]struct{})}
	s.admit.mu.Lock()
	s.admit.clock = c
	s.admit.mu.Unlock()
	return c
}

// Advance moves the clock on by d and fires the timers due by then.
func (c *AdmissionClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	for t := range c.timers {
		if !t.at.After(c.now) {
			t.c <- c.now
			delete(c.timers, t)
		}
	}
}

func (c *AdmissionClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *AdmissionClock) Timer(at time.Time) (<-chan time.Time, func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &fakeTimer{at: at, c: make(chan time.Time, 1)}
	if !at.After(c.now) {
		t.c <- c.now
		return t.c, func() {}
	}
	c.timers[t] = struct{}{}
	return t.c, func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		delete(c.timers, t)
	}
}

// SilencePresence makes s send nothing more on the presence bus, as a
// node that died: the others learn it only from its missing heart-beats.
func SilencePresence(s *Server) { s.pres.silent.Store(true) }

// DropPresenceSends makes s lose its next n messages on the presence bus
// (at most once: as a broker may lose them).
func DropPresenceSends(s *Server, n int) { s.pres.drop.Store(int32(n)) }

// SweepPresence runs s's sweep of dead nodes and ended graces as at now.
func SweepPresence(s *Server, now time.Time) { s.pres.sweep(now) }

// FlushPresence delivers s's coalesced presence changes now, as its
// interval's tick does.
func FlushPresence(s *Server) {
	s.pres.mu.Lock()
	s.pres.flushLocked()
	s.pres.unlock()
}

// DrainPresence starts s's presence drain, as Shutdown does first, without
// closing its connections: a test can end one and watch the others.
func DrainPresence(s *Server) { s.pres.drain() }
