package gateway

import (
	"fmt"
	"strings"

	"github.com/fanwire/fanwire/broker"
)

// maxSubjectLen bounds subjects and patterns; NATS itself has no hard limit,
// but a client has no business sending a 1 MiB pattern.
const maxSubjectLen = 512

// ValidatePattern checks a subscription pattern in NATS subject syntax:
// non-empty tokens separated by '.', where a token may be '*' (exactly one
// token) and the last token may be '>' (one or more trailing tokens).
func ValidatePattern(p string) error {
	return validateSubject(p, true)
}

// ValidateSubject checks a concrete subject: the same syntax as a pattern, but
// with no wildcard tokens. Publishing to a wildcard is an error.
func ValidateSubject(s string) error {
	return validateSubject(s, false)
}

func validateSubject(s string, wildcards bool) error {
	what := "subject"
	if wildcards {
		what = "pattern"
	}
	switch {
	case s == "":
		return fmt.Errorf("%w: empty %s", ErrBadPattern, what)
	case len(s) > maxSubjectLen:
		return fmt.Errorf("%w: %s longer than %d bytes", ErrBadPattern, what, maxSubjectLen)
	}
	start := 0
	for i := 0; i <= len(s); i++ {
		if i < len(s) && s[i] != '.' {
			c := s[i]
			if c <= ' ' || c == 0x7f {
				return fmt.Errorf("%w: %s %q contains whitespace or a control character", ErrBadPattern, what, s)
			}
			continue
		}
		tok := s[start:i]
		last := i == len(s)
		switch {
		case tok == "":
			return fmt.Errorf("%w: %s %q has an empty token", ErrBadPattern, what, s)
		case tok == "*" || tok == ">":
			if !wildcards {
				return fmt.Errorf("%w: subject %q must not contain wildcards", ErrBadPattern, s)
			}
			if tok == ">" && !last {
				return fmt.Errorf("%w: pattern %q: '>' must be the last token", ErrBadPattern, s)
			}
		case strings.ContainsAny(tok, "*>"):
			return fmt.Errorf("%w: %s %q: wildcard %q must be a whole token", ErrBadPattern, what, s, tok)
		}
		start = i + 1
	}
	return nil
}

// nextToken splits s at its first '.', returning the token and the rest;
// more is false when tok was the last token.
func nextToken(s string) (tok, rest string, more bool) {
	if i := strings.IndexByte(s, '.'); i >= 0 {
		return s[:i], s[i+1:], true
	}
	return s, "", false
}

// MatchSubject reports whether the concrete subject matches pattern. Both must
// be valid. It allocates nothing.
func MatchSubject(pattern, subject string) bool { return broker.MatchSubject(pattern, subject) }

// Intersects reports whether some concrete subject matches both patterns.
// It is used to reject subscriptions outside the node's subject space.
func Intersects(a, b string) bool {
	for {
		at, arest, amore := nextToken(a)
		bt, brest, bmore := nextToken(b)
		switch {
		case at == ">" || bt == ">":
			return true
		case at != "*" && bt != "*" && at != bt:
			return false
		case !amore || !bmore:
			return amore == bmore
		}
		a, b = arest, brest
	}
}

// Contains reports whether every subject matching inner also matches outer
// (inner ⊆ outer): orders.* is inside orders.>, orders.> is not inside
// orders.*. Both must be valid patterns.
func Contains(outer, inner string) bool {
	for {
		ot, orest, omore := nextToken(outer)
		it, irest, imore := nextToken(inner)
		switch {
		case ot == ">":
			return true // inner has at least this token left
		case it == ">":
			return false // inner goes on to any depth, outer does not
		case ot == "*":
			// any single token, including inner's '*'
		case ot != it:
			return false
		}
		if !omore || !imore {
			return omore == imore
		}
		outer, inner = orest, irest
	}
}
