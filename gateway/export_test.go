package gateway

import (
	"time"

	"github.com/fanwire/fanwire/gateway/internal/admission"
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

// AdmissionClock is the connect rate's clock in a test: it stands still
// until Advance, so a test decides when the next token comes.
type AdmissionClock = admission.ManualClock

// FreezeAdmission gives s's connect rate a clock that stands still. Call it
// before any upgrade request.
func FreezeAdmission(s *Server) *AdmissionClock {
	c := admission.NewManualClock()
	s.admit.SetClock(c)
	return c
}

// SilencePresence makes s send nothing more on the presence bus, as a
// node that died: the others learn it only from its missing heart-beats.
func SilencePresence(s *Server) { s.pres.Silence() }

// DropPresenceSends makes s lose its next n messages on the presence bus
// (at most once: as a broker may lose them).
func DropPresenceSends(s *Server, n int) { s.pres.DropSends(n) }

// SweepPresence runs s's sweep of dead nodes and ended graces as at now.
func SweepPresence(s *Server, now time.Time) { s.pres.Sweep(now) }

// FlushPresence delivers s's coalesced presence changes now, as its
// interval's tick does.
func FlushPresence(s *Server) { s.pres.Flush() }

// DrainPresence starts s's presence drain, as Shutdown does first, without
// closing its connections: a test can end one and watch the others.
func DrainPresence(s *Server) { s.pres.Drain() }
