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

// PatternsOverlap reports whether some concrete subject matches both
// patterns ('*' one token, '>' one or more trailing ones).
func PatternsOverlap(a, b string) bool {
	for {
		at, arest, amore := nextToken(a)
		bt, brest, bmore := nextToken(b)
		switch {
		case at == ">" || bt == ">":
			return true // each has a token here, and '>' takes any run of them
		case at != "*" && bt != "*" && at != bt:
			return false
		case !amore || !bmore:
			return amore == bmore
		}
		a, b = arest, brest
	}
}
