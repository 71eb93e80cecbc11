package gateway

import (
	"fmt"
	"strconv"
	"strings"
)

// System subjects: those whose first token starts with '$' ($JS.API, $KV,
// $SYS, $JS.EVENT advisories: the NATS server's APIs and events) or is
// _INBOX (request replies, the gateway's own among them). They are not
// events. A Core NATS subscription to > receives them all (the broker
// cannot subscribe to "everything but $…": NATS has no such filter), so
//
//   - publishing to one and subscribing to a pattern whose first token is
//     one are refused, unless Config.AllowSystemSubjects opens it
//     (publishauth.go has the publish side);
//   - a pattern whose first token is a wildcard (>, *.>) never matches a
//     system subject, in the hub, in replays and in per-connection
//     consumers (matchEvent): only a pattern that writes the first token
//     out does;
//   - the dispatcher drops the ones no opened pattern covers before it
//     builds their event (fanwire_events_dropped_total{reason=
//     "system_subject"}).
//
// A client library's custom inbox prefix (not _INBOX) is not recognised:
// keep such replies outside the gateway's subject space.

// isSystemSubject reports whether the first token of s, a subject or a
// pattern, is a system one. It allocates nothing.
func isSystemSubject(s string) bool {
	if s == "" {
		return false
	}
	switch s[0] {
	case '$':
		return true
	case '_':
		const inbox = "_INBOX"
		return strings.HasPrefix(s, inbox) && (len(s) == len(inbox) || s[len(inbox)] == '.')
	}
	return false
}

// wildFirst reports whether the first token of the valid pattern p is a
// wildcard.
func wildFirst(p string) bool {
	return p != "" && (p[0] == '*' || p[0] == '>') && (len(p) == 1 || p[1] == '.')
}

// matchEvent reports whether an event on subject goes to a subscription on
// pattern: MatchSubject, except that a pattern whose first token is a
// wildcard never matches a system subject. It allocates nothing.
func matchEvent(pattern, subject string) bool {
	if wildFirst(pattern) && isSystemSubject(subject) {
		return false
	}
	return MatchSubject(pattern, subject)
}

// systemAllowed reports whether the system subject is inside a pattern of
// Config.AllowSystemSubjects.
func (s *Server) systemAllowed(subject string) bool {
	for _, p := range s.cfg.AllowSystemSubjects {
		if MatchSubject(p, subject) {
			return true
		}
	}
	return false
}

// checkSystemPattern refuses a subscription to a system pattern that no
// pattern of Config.AllowSystemSubjects contains, or that the connection's
// grants (when it has any) do not name: a grant whose first token is a
// wildcard does not reach system subjects, as for publishing.
func (s *Server) checkSystemPattern(pattern string, g *Grants) error {
	if !isSystemSubject(pattern) {
		return nil
	}
	opened := false
	for _, p := range s.cfg.AllowSystemSubjects {
		if Contains(p, pattern) {
			opened = true
			break
		}
	}
	if !opened {
		return fmt.Errorf("%q is a system pattern (first token $… or _INBOX: the NATS server's APIs and replies): closed unless --allow-system-subjects opens it", pattern)
	}
	if g == nil {
		return nil
	}
	for _, p := range g.Subscribe {
		if !wildFirst(p) && Contains(p, pattern) {
			return nil
		}
	}
	return fmt.Errorf("%q is a system pattern opened by --allow-system-subjects, but this connection's token has no subscribe pattern that names its first token", pattern)
}

// validateAllowSystem checks Config.AllowSystemSubjects: valid patterns
// whose first token is a system one, written out.
func validateAllowSystem(patterns []string) []error {
	var errs []error
	for i, p := range patterns {
		if err := ValidatePattern(p); err != nil {
			errs = append(errs, fmt.Errorf("AllowSystemSubjects[%d]: %w", i, err))
			continue
		}
		if !isSystemSubject(p) {
			errs = append(errs, fmt.Errorf("AllowSystemSubjects[%d]: %s does not start with a system token ($… or _INBOX): it opens nothing", i, strconv.Quote(p)))
		}
	}
	return errs
}
