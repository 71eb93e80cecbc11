package subject

import (
	"unicode"
	"unicode/utf8"
)

// NATS and subscribers compare subjects byte for byte, but a consumer
// downstream that folds case, or a person reading a log, would take
// "DB.orders.1" or a full-width "ｄｂ.orders.1" for "db.orders.1": a check
// that keeps a subject space to one writer (the gateway's reserved
// subjects) compares folded. Validation has already refused invisible
// characters, so what is left to fold is case and width.

// FoldMatch is Match on tokens compared folded for case and width.
func FoldMatch(pattern, subject string) bool {
	for {
		pt, prest, pmore := Next(pattern)
		st, srest, smore := Next(subject)
		switch {
		case pt == ">":
			return true
		case pt != "*" && !foldEqual(pt, st):
			return false
		case !pmore || !smore:
			return pmore == smore
		}
		pattern, subject = prest, srest
	}
}

// FoldContains is Contains on tokens compared folded for case and width.
func FoldContains(outer, inner string) bool {
	for {
		ot, orest, omore := Next(outer)
		it, irest, imore := Next(inner)
		switch {
		case ot == ">":
			return true
		case it == ">":
			return false
		case ot == "*":
		case it == "*" || !foldEqual(ot, it):
			return false
		}
		if !omore || !imore {
			return omore == imore
		}
		outer, inner = orest, irest
	}
}

// foldRune maps r to its folded form: full-width ASCII (U+FF01–U+FF5E) to
// ASCII, then the smallest rune of its Unicode simple case-folding orbit
// (so 'K', 'k' and the Kelvin sign U+212A fold alike).
func foldRune(r rune) rune {
	if r >= 0xFF01 && r <= 0xFF5E {
		r -= 0xFEE0
	}
	if r < utf8.RuneSelf {
		if 'A' <= r && r <= 'Z' {
			r += 'a' - 'A'
		}
		return r
	}
	min := r
	for f := unicode.SimpleFold(r); f != r; f = unicode.SimpleFold(f) {
		if f < min {
			min = f
		}
	}
	if min >= 'A' && min <= 'Z' {
		min += 'a' - 'A'
	}
	return min
}

// foldEqual reports whether two tokens are equal once folded. It
// allocates nothing.
func foldEqual(a, b string) bool {
	for a != "" && b != "" {
		ra, na := utf8.DecodeRuneInString(a)
		rb, nb := utf8.DecodeRuneInString(b)
		if ra != rb && foldRune(ra) != foldRune(rb) {
			return false
		}
		a, b = a[na:], b[nb:]
	}
	return a == b
}
