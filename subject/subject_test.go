package subject

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
)

func TestValidatePattern(t *testing.T) {
	long := strings.Repeat("a.", MaxLen/2-1) + "ab" // exactly MaxLen bytes
	if len(long) != MaxLen {
		t.Fatalf("test setup: len(long) = %d", len(long))
	}
	tests := []struct {
		name    string
		pattern string
		ok      bool
	}{
		{"one token", "orders", true},
		{"two tokens", "orders.42", true},
		{"star alone", "*", true},
		{"gt alone", ">", true},
		{"star middle", "orders.*.items", true},
		{"star last", "orders.*", true},
		{"gt last", "orders.>", true},
		{"star then gt", "*.*.>", true},
		{"non-ASCII", "zamówienia.ü", true},
		{"punctuation", "a-b_c/d:e@f", true},
		{"max length", long, true},

		{"empty", "", false},
		{"dot", ".", false},
		{"leading dot", ".a", false},
		{"trailing dot", "a.", false},
		{"double dot", "a..b", false},
		{"space", "a b", false},
		{"leading space", " a", false},
		{"tab", "a\tb", false},
		{"newline", "a\nb", false},
		{"carriage return", "a\rb", false},
		{"form feed", "a\fb", false},
		{"NUL", "a\x00", false},
		{"DEL", "a\x7f", false},
		{"gt not last", ">.a", false},
		{"gt middle", "a.>.b", false},
		{"star inside token", "orders.a*", false},
		{"star prefix", "*a", false},
		{"gt inside token", "a.b>", false},
		{"double gt", ">>", false},
		{"double star", "**", false},
		{"too long", long + "b", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := ValidatePattern(tt.pattern)
			if (err == nil) != tt.ok {
				t.Fatalf("ValidatePattern(%q) = %v, want ok=%v", tt.pattern, err, tt.ok)
			}
			if err != nil && !errors.Is(err, ErrBadPattern) {
				t.Fatalf("ValidatePattern(%q) = %v, want it to wrap ErrBadPattern", tt.pattern, err)
			}
			if tt.ok && !server.IsValidSubject(tt.pattern) {
				t.Errorf("we accept %q but NATS IsValidSubject rejects it", tt.pattern)
			}
		})
	}
}

func TestValidate(t *testing.T) {
	tests := []struct {
		name    string
		subject string
		ok      bool
	}{
		{"one token", "orders", true},
		{"three tokens", "orders.42.items", true},
		{"non-ASCII", "zamówienia.ü", true},

		{"empty", "", false},
		{"star", "*", false},
		{"gt", ">", false},
		{"star token", "orders.*", false},
		{"gt token", "orders.>", false},
		{"star middle", "a.*.b", false},
		{"star inside token", "orders.a*", false},
		{"gt inside token", "a>", false},
		{"empty token", "a..b", false},
		{"trailing dot", "a.", false},
		{"space", "a b", false},
		{"NUL", "a\x00b", false},
		{"too long", strings.Repeat("a", MaxLen+1), false},
		{"zero-width space", "db\u200b.orders", false},
		{"zero-width joiner", "a\u200db", false},
		{"word joiner", "a\u2060", false},
		{"soft hyphen", "d\u00adb", false},
		{"bidi override", "\u202edb", false},
		{"bidi isolate", "a\u2066b", false},
		{"byte order mark", "\ufeffdb", false},
		{"C1 control", "a\u0085b", false},
		{"no-break space", "a\u00a0b", false},
		{"ideographic space", "a\u3000b", false},
		{"line separator", "a\u2028b", false},
		{"replacement character", "a\ufffdb", false},
		{"invalid UTF-8", "a\xffb", false},
		{"truncated UTF-8", "a\xc3", false},
		{"tag character", "a\U000e0041", false},
		{"full-width letters", "\uff44\uff42.x", true},
		{"emoji", "chat.\U0001f600", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := Validate(tt.subject)
			if (err == nil) != tt.ok {
				t.Fatalf("Validate(%+q) = %v, want ok=%v", tt.subject, err, tt.ok)
			}
			if err != nil && !errors.Is(err, ErrBadPattern) {
				t.Fatalf("Validate(%q) = %v, want it to wrap ErrBadPattern", tt.subject, err)
			}
			if tt.ok && !server.IsValidLiteralSubject(tt.subject) {
				t.Errorf("we accept %q but NATS IsValidLiteralSubject rejects it", tt.subject)
			}
		})
	}
}

func TestMatch(t *testing.T) {
	tests := []struct {
		pattern, subject string
		want             bool
	}{
		{"a", "a", true},
		{"a", "b", false},
		{"a", "a.b", false},
		{"a.b", "a", false},
		{"a.b", "a.b", true},
		{"*", "a", true},
		{"*", "a.b", false},
		{"a.*", "a", false},
		{"a.*", "a.b", true},
		{"a.*", "a.b.c", false},
		{"*.b", "a.b", true},
		{"*.b", "a.c", false},
		{"a.*.c", "a.b.c", true},
		{"a.*.c", "a.b.d", false},
		{">", "a", true},
		{">", "a.b.c", true},
		{"a.>", "a", false},
		{"a.>", "a.b", true},
		{"a.>", "a.b.c", true},
		{"a.>", "b.c", false},
		{"*.>", "a", false},
		{"*.>", "a.b", true},
		{"a.*.>", "a.b", false},
		{"a.*.>", "a.b.c.d", true},
		{"orders", "orders2", false},
		{"orders2", "orders", false},
		{"ab.c", "a.bc", false},
	}
	for _, tt := range tests {
		t.Run(tt.pattern+"~"+tt.subject, func(t *testing.T) {
			if got := Match(tt.pattern, tt.subject); got != tt.want {
				t.Errorf("Match(%q, %q) = %v, want %v", tt.pattern, tt.subject, got, tt.want)
			}
			if got := server.SubjectMatchesFilter(tt.subject, tt.pattern); got != tt.want {
				t.Errorf("test table disagrees with NATS: SubjectMatchesFilter(%q, %q) = %v", tt.subject, tt.pattern, got)
			}
		})
	}
}

func TestOverlap(t *testing.T) {
	tests := []struct {
		a, b string
		want bool
	}{
		{"a", "a", true},
		{"a", "b", false},
		{"a", "a.b", false},
		{"*", "a", true},
		{"*", "a.b", false},
		{"*", "*", true},
		{"*", ">", true},
		{">", ">", true},
		{">", "a.b.c", true},
		{"a.>", "a", false},
		{"a.>", "a.*", true},
		{"a.>", "b.>", false},
		{"a.>", "*.b", true},
		{"a.>", "*.b.>", true},
		{"a.*", "*.b", true},
		{"a.*", "b.*", false},
		{"a.*", "a.b.>", false},
		{"a.*", "*.b.c", false},
		{"a.*.c", "*.b.*", true},
		{"a.*.c", "*.b.d", false},
		{"*.>", "a", false},
		{"*.>", ">", true},
		{"a.b.>", "a.>", true},
		{"a.b.c", "a.>", true},
		{"a.b.c", "a.b", false},
	}
	for _, tt := range tests {
		t.Run(tt.a+"~"+tt.b, func(t *testing.T) {
			if got := Overlap(tt.a, tt.b); got != tt.want {
				t.Errorf("Overlap(%q, %q) = %v, want %v", tt.a, tt.b, got, tt.want)
			}
			if got := Overlap(tt.b, tt.a); got != tt.want {
				t.Errorf("Overlap(%q, %q) = %v, want %v (not symmetric)", tt.b, tt.a, got, tt.want)
			}
			if got := server.SubjectsCollide(tt.a, tt.b); got != tt.want {
				t.Errorf("test table disagrees with NATS: SubjectsCollide(%q, %q) = %v", tt.a, tt.b, got)
			}
		})
	}
}

// allSubjects returns every token sequence of 1..maxLen tokens drawn from
// toks; with wildcards, '>' only as the last token.
func allSubjects(toks []string, maxLen int) []string {
	var out []string
	var walk func(prefix string, n int)
	walk = func(prefix string, n int) {
		for _, tok := range toks {
			s := tok
			if prefix != "" {
				s = prefix + "." + tok
			}
			out = append(out, s)
			if tok != ">" && n+1 < maxLen {
				walk(s, n+1)
			}
		}
	}
	walk("", 0)
	return out
}

// TestMatchAgainstNATS compares Match with NATS's
// SubjectMatchesFilter for every pattern of up to four tokens over {a, b, *, >}
// and every subject of up to four tokens over {a, b, c}.
func TestMatchAgainstNATS(t *testing.T) {
	patterns := allSubjects([]string{"a", "b", "*", ">"}, 4)
	subjects := allSubjects([]string{"a", "b", "c"}, 4)
	n := 0
	for _, p := range patterns {
		if err := ValidatePattern(p); err != nil {
			t.Fatalf("generated pattern %q: %v", p, err)
		}
		for _, s := range subjects {
			if err := Validate(s); err != nil {
				t.Fatalf("generated subject %q: %v", s, err)
			}
			got, want := Match(p, s), server.SubjectMatchesFilter(s, p)
			if got != want {
				t.Errorf("Match(%q, %q) = %v, NATS SubjectMatchesFilter says %v", p, s, got, want)
			}
			if i := Overlap(p, s); i != got {
				t.Errorf("Overlap(%q, %q) = %v, Match = %v", p, s, i, got)
			}
			n++
		}
	}
	t.Logf("%d pairs", n)
}

// TestOverlapAgainstNATS compares Overlap with NATS's SubjectsCollide
// and with a constructive oracle for every pair of patterns of up to four
// tokens over {a, b, *, >}.
func TestOverlapAgainstNATS(t *testing.T) {
	patterns := allSubjects([]string{"a", "b", "*", ">"}, 4)
	for _, a := range patterns {
		for _, b := range patterns {
			checkOverlap(t, a, b)
		}
	}
	t.Logf("%d pairs", len(patterns)*len(patterns))
}

func checkOverlap(t testing.TB, a, b string) {
	t.Helper()
	got := Overlap(a, b)
	if want := server.SubjectsCollide(a, b); got != want {
		t.Errorf("Overlap(%q, %q) = %v, NATS SubjectsCollide says %v", a, b, got, want)
	}
	if rev := Overlap(b, a); rev != got {
		t.Errorf("Overlap(%q, %q) = %v but Overlap(%q, %q) = %v", a, b, got, b, a, rev)
	}
	w, ok := witness(a, b)
	if got != ok {
		t.Errorf("Overlap(%q, %q) = %v, but a common subject exists: %v (%q)", a, b, got, ok, w)
	}
	if ok && (!Match(a, w) || !Match(b, w)) {
		t.Errorf("witness %q of %q and %q does not match both", w, a, b)
	}
}

// witness builds a concrete subject matching both valid patterns, if one
// exists: literal tokens where either pattern has one, "x" where both are
// wildcards, and the other pattern's remaining tokens after a '>'.
func witness(a, b string) (string, bool) {
	ta, tb := strings.Split(a, "."), strings.Split(b, ".")
	concrete := func(toks []string) []string {
		out := make([]string, len(toks))
		for i, tok := range toks {
			out[i] = tok
			if tok == "*" || tok == ">" {
				out[i] = "x"
			}
		}
		return out
	}
	var w []string
	for i := 0; ; i++ {
		switch {
		case i == len(ta) && i == len(tb):
			return strings.Join(w, "."), true
		case i == len(ta) || i == len(tb):
			return "", false
		case ta[i] == ">":
			return strings.Join(append(w, concrete(tb[i:])...), "."), true
		case tb[i] == ">":
			return strings.Join(append(w, concrete(ta[i:])...), "."), true
		case ta[i] == "*" && tb[i] == "*":
			w = append(w, "x")
		case ta[i] == "*":
			w = append(w, tb[i])
		case tb[i] == "*" || ta[i] == tb[i]:
			w = append(w, ta[i])
		default:
			return "", false
		}
	}
}

// FuzzPattern checks the validators, Match and Overlap against
// NATS's own implementation wherever our (stricter) validators accept.
func FuzzPattern(f *testing.F) {
	for _, s := range [][2]string{
		{"orders.*", "orders.42"},
		{"orders.>", "orders"},
		{">", "a.b.c"},
		{"*.*", "a.b"},
		{"a.*.c", "*.b.>"},
		{"a.>", "*.b"},
		{"a*", "a"},
		{"a..b", "a.b"},
		{"ü.*", "ü.ö"},
		{"a.\xff", "a.\xff"},
		{"*.>", ">"},
		{"a b", "a"},
		{"", ""},
	} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, a, b string) {
		// Documented for valid input only, but must not panic on any.
		_ = Match(a, b)
		_ = Overlap(a, b)
		aPattern := ValidatePattern(a) == nil
		bPattern := ValidatePattern(b) == nil
		bSubject := Validate(b) == nil
		if Validate(a) == nil && !aPattern {
			t.Fatalf("%q is a valid subject but not a valid pattern", a)
		}
		if bSubject && !bPattern {
			t.Fatalf("%q is a valid subject but not a valid pattern", b)
		}
		for _, p := range []string{a, b} {
			if ValidatePattern(p) == nil && !server.IsValidSubject(p) {
				t.Fatalf("we accept pattern %q, NATS IsValidSubject rejects it", p)
			}
			if Validate(p) == nil && (!server.IsValidSubject(p) || !server.IsValidLiteralSubject(p)) {
				t.Fatalf("we accept subject %q, NATS rejects it", p)
			}
		}
		if aPattern && bSubject {
			got := Match(a, b)
			if want := server.SubjectMatchesFilter(b, a); got != want {
				t.Fatalf("Match(%q, %q) = %v, NATS SubjectMatchesFilter says %v", a, b, got, want)
			}
			if i := Overlap(a, b); i != got {
				t.Fatalf("Overlap(%q, %q) = %v, Match = %v", a, b, i, got)
			}
		}
		if aPattern && bPattern {
			checkOverlap(t, a, b)
		}
	})
}

func TestContains(t *testing.T) {
	for _, tc := range []struct {
		outer, inner string
		want         bool
	}{
		{"orders.>", "orders.*", true}, {"orders.*", "orders.>", false},
		{">", "a", true}, {">", "a.b.>", true}, {"a.>", "a", false}, {"a.>", "a.>", true},
		{"a.*", "a.b", true}, {"a.*", "a.*", true}, {"a.b", "a.*", false}, {"a.*", "a.b.c", false},
		{"a.*.c", "a.b.c", true}, {"a.*.c", "a.*.d", false}, {"*", ">", false}, {"a", "a", true},
	} {
		if got := Contains(tc.outer, tc.inner); got != tc.want {
			t.Errorf("Contains(%q, %q) = %v, want %v", tc.outer, tc.inner, got, tc.want)
		}
	}
	// Property: if inner ⊆ outer, every subject matching inner matches outer.
	subjects := []string{"a", "b", "a.b", "a.c", "a.b.c", "a.b.d", "b.b.c", "a.b.c.d"}
	patterns := []string{">", "*", "a", "a.*", "a.>", "*.b.*", "a.b.*", "a.*.c", "*.*", "a.b.>", "*.>"}
	for _, o := range patterns {
		for _, i := range patterns {
			if !Contains(o, i) {
				continue
			}
			for _, s := range subjects {
				if Match(i, s) && !Match(o, s) {
					t.Errorf("Contains(%q, %q) but %q matches only the inner one", o, i, s)
				}
			}
		}
	}
}

// refMatch is a reference matcher for the Contains tests, written
// independently of Match: pattern and subject as token slices.
func refMatch(p, s []string) bool {
	switch {
	case len(p) == 0:
		return len(s) == 0
	case p[0] == ">":
		return len(s) > 0
	case len(s) == 0:
		return false
	case p[0] != "*" && p[0] != s[0]:
		return false
	}
	return refMatch(p[1:], s[1:])
}

// tokenSeqs returns every token sequence of 1..maxLen tokens over alphabet.
func tokenSeqs(alphabet []string, maxLen int) [][]string {
	var out [][]string
	level := [][]string{nil}
	for n := 1; n <= maxLen; n++ {
		var next [][]string
		for _, prefix := range level {
			for _, tok := range alphabet {
				next = append(next, append(slices.Clone(prefix), tok))
			}
		}
		out = append(out, next...)
		level = next
	}
	return out
}

// TestContainsBruteForce checks Contains on every pair of patterns of 1..4
// tokens from {a, b, *} (the last one possibly '>') against the definition:
// Contains(o, i) iff every subject over {a, b, c} of 1..5 tokens that
// matches i matches o. Five tokens is one more than the longest pattern,
// which is enough to tell every pair apart.
func TestContainsBruteForce(t *testing.T) {
	var patterns []string
	for _, toks := range tokenSeqs([]string{"a", "b", "*"}, 4) {
		patterns = append(patterns, strings.Join(toks, "."))
		toks[len(toks)-1] = ">"
		if p := strings.Join(toks, "."); !slices.Contains(patterns, p) {
			patterns = append(patterns, p)
		}
	}
	subjects := tokenSeqs([]string{"a", "b", "c"}, 5)
	matches := make(map[string][]bool, len(patterns)) // pattern → matches subjects[k]
	for _, p := range patterns {
		if err := ValidatePattern(p); err != nil {
			t.Fatalf("test setup: %v", err)
		}
		m := make([]bool, len(subjects))
		for k, s := range subjects {
			m[k] = refMatch(strings.Split(p, "."), s)
			if got := Match(p, strings.Join(s, ".")); got != m[k] {
				t.Fatalf("Match(%q, %q) = %v, reference says %v", p, strings.Join(s, "."), got, m[k])
			}
		}
		matches[p] = m
	}
	trues := 0
	for _, o := range patterns {
		for _, i := range patterns {
			want := true
			for k := range subjects {
				if matches[i][k] && !matches[o][k] {
					want = false
					break
				}
			}
			if got := Contains(o, i); got != want {
				t.Errorf("Contains(%q, %q) = %v, brute force says %v", o, i, got, want)
			}
			if want {
				trues++
			}
		}
	}
	t.Logf("%d patterns, %d subjects, %d of %d pairs contained", len(patterns), len(subjects), trues, len(patterns)*len(patterns))
}

// checkContains checks Contains(o, i) for two valid patterns of at most
// maxTokens tokens against the definition, by enumerating the subjects that
// match i with each wildcard position filled from o's literal tokens plus
// one token in neither pattern. That set is complete: a subject that
// matches i but not o stays such a counterexample when each token not
// among o's literals becomes the fresh one (i has a wildcard there), and
// when a '>' of i is expanded to no more tokens than o can still look at.
func checkContains(t testing.TB, o, i string) {
	t.Helper()
	ot, it := strings.Split(o, "."), strings.Split(i, ".")
	fresh := "fresh"
	for strings.Contains(o, fresh) || strings.Contains(i, fresh) {
		fresh += "_"
	}
	alphabet := []string{fresh}
	for _, tok := range ot {
		if tok != "*" && tok != ">" && !slices.Contains(alphabet, tok) {
			alphabet = append(alphabet, tok)
		}
	}
	want := true
	var walk func(pos int, s []string) bool // false once a counterexample is found
	walk = func(pos int, s []string) bool {
		if pos == len(it) {
			if !refMatch(ot, s) {
				want = false
				if Contains(o, i) {
					t.Fatalf("Contains(%q, %q) = true, but %q matches only the inner one", o, i, strings.Join(s, "."))
				}
				return false
			}
			return true
		}
		switch it[pos] {
		case "*":
			for _, tok := range alphabet {
				if !walk(pos+1, append(s, tok)) {
					return false
				}
			}
			return true
		case ">":
			for _, tail := range tokenSeqs(alphabet, max(1, len(ot)+1-pos)) {
				if !walk(pos+1, append(slices.Clone(s), tail...)) {
					return false
				}
			}
			return true
		}
		return walk(pos+1, append(s, it[pos]))
	}
	walk(0, nil)
	if got := Contains(o, i); got != want {
		t.Fatalf("Contains(%q, %q) = %v, enumeration says %v", o, i, got, want)
	}
}

// FuzzContains checks Contains on pairs of valid patterns: it agrees with
// the definition (checkContains, for patterns of up to 5 tokens), every
// pattern contains itself, containment implies intersection, and mutual
// containment means the patterns are equal.
func FuzzContains(f *testing.F) {
	for _, s := range [][2]string{
		{"orders.>", "orders.*"},
		{"orders.*", "orders.>"},
		{"orders.*", "orders.42"},
		{">", "a.b"},
		{"a.*.c", "a.b.c"},
		{"a.b", "a.*"},
		{"a.>", "a"},
		{"*.*.>", "a.>"},
		{"fresh.*", "fresh_.b"},
	} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, o, i string) {
		_ = Contains(o, i) // documented for valid patterns only, but must not panic
		if ValidatePattern(o) != nil || ValidatePattern(i) != nil {
			return
		}
		for _, p := range []string{o, i} {
			if !Contains(p, p) {
				t.Fatalf("Contains(%q, %q) = false", p, p)
			}
		}
		got := Contains(o, i)
		if got && !Overlap(o, i) {
			t.Fatalf("Contains(%q, %q) but not Overlap", o, i)
		}
		if got && Contains(i, o) && o != i {
			t.Fatalf("%q and %q contain each other but differ", o, i)
		}
		if strings.Count(o, ".") < 5 && strings.Count(i, ".") < 5 {
			checkContains(t, o, i)
		}
	})
}
