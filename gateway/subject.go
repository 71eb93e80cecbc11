package gateway

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/fanwire/fanwire/broker"
)

// maxSubjectLen bounds subjects and patterns; NATS itself has no hard limit,
// but a client has no business sending a 1 MiB pattern.
const maxSubjectLen = 512

// ValidatePattern checks a subscription pattern in NATS subject syntax:
// non-empty tokens separated by '.', where a token may be '*' (exactly one
// token) and the last token may be '>' (one or more trailing tokens).
//
// Subjects and patterns are valid UTF-8 without control characters (C0,
// DEL, C1), format characters (zero-width spaces and joiners, soft hyphen,
// bidirectional overrides, byte order mark: Unicode category Cf), spaces
// and separators of any kind, or U+FFFD (what invalid UTF-8 and lone
// surrogate escapes decode to): a subject that looks like another one on
// screen is another subject to NATS and to every subscriber, and would
// slip past a byte-exact check such as the reserved subjects'. Letters of
// any script are accepted.
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
			if c >= utf8.RuneSelf {
				r, n := utf8.DecodeRuneInString(s[i:])
				if why := badRune(r, n); why != "" {
					return fmt.Errorf("%w: %s %+q contains %s", ErrBadPattern, what, s, why)
				}
				i += n - 1
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

// badRune says why the non-ASCII rune r (n bytes long) may not be in a
// subject ("" when it may).
func badRune(r rune, n int) string {
	switch {
	case r == utf8.RuneError && n <= 1:
		return "bytes that are not valid UTF-8"
	case r == utf8.RuneError:
		return "U+FFFD (the replacement for invalid UTF-8 or a lone surrogate)"
	case unicode.Is(unicode.Cc, r):
		return fmt.Sprintf("the control character %U", r)
	case unicode.Is(unicode.Cf, r):
		return fmt.Sprintf("the invisible format character %U", r)
	case unicode.Is(unicode.Z, r) || unicode.IsSpace(r):
		return fmt.Sprintf("the space or separator %U", r)
	}
	return ""
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
