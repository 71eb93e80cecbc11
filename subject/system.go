package subject

import "strings"

// System subjects are those whose first token starts with '$' ($JS.API,
// $KV, $SYS, $JS.EVENT advisories: the NATS server's APIs and events) or
// is _INBOX (request replies). They are not events. A Core NATS
// subscription to > receives them all (NATS cannot subscribe to
// "everything but $…"), so a pattern whose first token is a wildcard (>,
// *.>) never matches a system subject (MatchEvent): only a pattern that
// writes the first token out does. A client library's custom inbox prefix
// (not _INBOX) is not recognised.

// IsSystem reports whether the first token of s, a subject or a pattern,
// is a system one.
func IsSystem(s string) bool {
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

// WildFirst reports whether the first token of the valid pattern p is a
// wildcard.
func WildFirst(p string) bool {
	return p != "" && (p[0] == '*' || p[0] == '>') && (len(p) == 1 || p[1] == '.')
}

// MatchEvent reports whether an event on subject goes to a subscription on
// pattern: Match, except that a pattern whose first token is a wildcard
// never matches a system subject.
func MatchEvent(pattern, subject string) bool {
	if WildFirst(pattern) && IsSystem(subject) {
		return false
	}
	return Match(pattern, subject)
}
