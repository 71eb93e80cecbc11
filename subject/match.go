package subject

import "strings"

// Next splits s at its first '.', returning the token and the rest; more
// is false when tok was the last token.
func Next(s string) (tok, rest string, more bool) {
	if i := strings.IndexByte(s, '.'); i >= 0 {
		return s[:i], s[i+1:], true
	}
	return s, "", false
}

// Match reports whether the concrete subject matches pattern, as NATS
// matches them. Both must be valid.
func Match(pattern, subject string) bool {
	for {
		pt, prest, pmore := Next(pattern)
		st, srest, smore := Next(subject)
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

// Overlap reports whether some concrete subject matches both patterns.
func Overlap(a, b string) bool {
	for {
		at, arest, amore := Next(a)
		bt, brest, bmore := Next(b)
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

// Contains reports whether every subject matching inner also matches outer
// (inner ⊆ outer): orders.* is inside orders.>, orders.> is not inside
// orders.*. Both must be valid patterns.
func Contains(outer, inner string) bool {
	for {
		ot, orest, omore := Next(outer)
		it, irest, imore := Next(inner)
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
