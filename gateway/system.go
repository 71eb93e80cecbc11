package gateway

import (
	"fmt"
	"strconv"

	"github.com/fanwire/fanwire/gateway/auth"
	"github.com/fanwire/fanwire/subject"
)

// System subjects ($… and _INBOX: the NATS server's APIs, events and
// replies; subject.IsSystem) are not events:
//
//   - publishing to one and subscribing to a pattern whose first token is
//     one are refused, unless Config.AllowSystemSubjects opens it
//     (publishauth.go has the publish side);
//   - a pattern whose first token is a wildcard never matches a system
//     subject, in the hub, in replays and in per-connection consumers
//     (subject.MatchEvent);
//   - the dispatcher drops the ones no opened pattern covers before it
//     builds their event (fanwire_events_dropped_total{reason=
//     "system_subject"}).

// systemAllowed reports whether the system subject is inside a pattern of
// Config.AllowSystemSubjects.
func (s *Server) systemAllowed(subj string) bool {
	for _, p := range s.cfg.AllowSystemSubjects {
		if subject.Match(p, subj) {
			return true
		}
	}
	return false
}

// checkSystemPattern refuses a subscription to a system pattern that no
// pattern of Config.AllowSystemSubjects contains, or that the connection's
// grants (when it has any) do not name: a grant whose first token is a
// wildcard does not reach system subjects, as for publishing.
func (s *Server) checkSystemPattern(pattern string, g *auth.Grants) error {
	if !subject.IsSystem(pattern) {
		return nil
	}
	opened := false
	for _, p := range s.cfg.AllowSystemSubjects {
		if subject.Contains(p, pattern) {
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
		if !subject.WildFirst(p) && subject.Contains(p, pattern) {
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
		if err := subject.ValidatePattern(p); err != nil {
			errs = append(errs, fmt.Errorf("AllowSystemSubjects[%d]: %w", i, err))
			continue
		}
		if !subject.IsSystem(p) {
			errs = append(errs, fmt.Errorf("AllowSystemSubjects[%d]: %s does not start with a system token ($… or _INBOX): it opens nothing", i, strconv.Quote(p)))
		}
	}
	return errs
}
