package subject

import (
	"errors"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// ErrBadPattern is wrapped by every error of ValidatePattern and Validate.
var ErrBadPattern = errors.New("bad pattern")

// MaxLen bounds subjects and patterns in bytes. NATS itself has no hard
// limit, but a client has no business sending a 1 MiB pattern.
const MaxLen = 512

// ValidatePattern checks a subscription pattern: non-empty tokens separated
// by '.', where a token may be '*' (exactly one token) and the last token
// may be '>' (one or more trailing tokens).
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
	return validate(p, true)
}

// Validate checks a concrete subject: the syntax of a pattern, with no
// wildcard tokens. Publishing to a wildcard is an error.
func Validate(s string) error {
	return validate(s, false)
}

func validate(s string, wildcards bool) error {
	what := "subject"
	if wildcards {
		what = "pattern"
	}
	switch {
	case s == "":
		return fmt.Errorf("%w: empty %s", ErrBadPattern, what)
	case len(s) > MaxLen:
		return fmt.Errorf("%w: %s longer than %d bytes", ErrBadPattern, what, MaxLen)
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
