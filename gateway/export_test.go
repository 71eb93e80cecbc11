package gateway

import "time"

// ForceGraphQLExecutor makes s serve every GraphQL subscription through
// gqlgen's executor, as it does the selections its fast path does not
// cover. Call it before any connection.
func ForceGraphQLExecutor(s *Server) { s.gqlExecutorOnly = true }

// IndexSize reports the subscriptions in s's index and the trie nodes that
// hold them (the root excluded): both return to zero when every
// subscription is gone, or the index leaks.
func IndexSize(s *Server) (subs, nodes int) {
	ix := s.hub.idx
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	var count func(n *node) int
	count = func(n *node) int {
		c := 0
		for _, ch := range n.next {
			c += 1 + count(ch)
		}
		if n.star != nil {
			c += 1 + count(n.star)
		}
		if n.gt != nil {
			c += 1 + count(n.gt)
		}
		return c
	}
	return ix.size, count(ix.root)
}

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

// SetTokenKeysClock makes a's key files checked, and its retired keys
// expire, by now instead of the wall clock.
func SetTokenKeysClock(a *JWTAuth, now func() time.Time) {
	a.keys.mu.Lock()
	defer a.keys.mu.Unlock()
	a.keys.now = now
}
