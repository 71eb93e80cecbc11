package broker

import "strings"

// MatchSubject reports whether the concrete subject matches pattern ('*'
// one token, '>' one or more trailing ones), as NATS matches them. Both
// must be valid (the gateway validates them). It allocates nothing.
func MatchSubject(pattern, subject string) bool {
	for {
		pt, prest, pmore := nextToken(pattern)
		st, srest, smore := nextToken(subject)
		switch {
		case pt == ">":
			return true // '>' needs at least one token, and st is one
		case pt != "*" && pt != st:
			return false
		case !pmore || !smore:
			return pmore == smore
		}
		pattern, subject = prest, srest
	}
}

func nextToken(s string) (tok, rest string, more bool) {
	if i := strings.IndexByte(s, '.'); i >= 0 {
		return s[:i], s[i+1:], true
	}
	return s, "", false
}
