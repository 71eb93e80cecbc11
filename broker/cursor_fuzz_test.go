package broker_test

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/fanwire/fanwire/broker"
)

// FuzzCursors: a client hands the gateway any string as a cursor (`from`,
// resume). Parsing one never panics; a refusal wraps ErrBadCursor (the
// client gets bad_cursor); an accepted JetStream cursor is canonical (it
// formats back to itself), an accepted Redis cursor orders equal to its
// canonical form; and CompareCursors is antisymmetric.
func FuzzCursors(f *testing.F) {
	for _, s := range [][2]string{
		{"js:1", "js:2"}, {"js:18446744073709551615", "js:0"}, {"js:01", "js:+1"}, {"js:", "js:-1"},
		{"rs:1-0", "rs:1-1"}, {"rs:0-0", "rs:00-000"}, {"rs:1", "rs:-"}, {"rs:18446744073709551616-0", "rs:1-2-3"},
		{"", "first"}, {"js:1", "rs:1-0"}, {"rs: 1-0", "js:\x00"},
	} {
		f.Add(s[0], s[1])
	}
	js, rs := new(broker.JetStream), new(broker.Redis)
	f.Fuzz(func(t *testing.T, a, b string) {
		okJS := func(c string) bool {
			seq, err := broker.ParseJSCursor(c)
			if err != nil {
				if !errors.Is(err, broker.ErrBadCursor) {
					t.Fatalf("ParseJSCursor(%q): %v does not wrap ErrBadCursor", c, err)
				}
				return false
			}
			if back := broker.FormatJSCursor(seq); back != c {
				t.Fatalf("ParseJSCursor(%q) = %d, which formats as %q", c, seq, back)
			}
			return true
		}
		okRS := func(c string) bool {
			id, err := broker.ParseRedisCursor(c)
			if err != nil {
				if !errors.Is(err, broker.ErrBadCursor) {
					t.Fatalf("ParseRedisCursor(%q): %v does not wrap ErrBadCursor", c, err)
				}
				return false
			}
			ms, seq, _ := strings.Cut(id, "-")
			m, err1 := strconv.ParseUint(ms, 10, 64)
			s, err2 := strconv.ParseUint(seq, 10, 64)
			if err1 != nil || err2 != nil {
				t.Fatalf("accepted %q: %v, %v", c, err1, err2)
			}
			canon := fmt.Sprintf("%s%d-%d", broker.CursorPrefixRedis, m, s)
			if n, err := rs.CompareCursors(c, canon); err != nil || n != 0 {
				t.Fatalf("CompareCursors(%q, its canonical %q) = %d, %v", c, canon, n, err)
			}
			return true
		}
		for _, k := range []struct {
			ok      func(string) bool
			compare func(x, y string) (int, error)
		}{{okJS, js.CompareCursors}, {okRS, rs.CompareCursors}} {
			okA, okB := k.ok(a), k.ok(b)
			ab, errAB := k.compare(a, b)
			ba, errBA := k.compare(b, a)
			if (errAB == nil) != (okA && okB) || (errBA == nil) != (okA && okB) {
				t.Fatalf("CompareCursors(%q, %q): errors %v, %v; parse ok %v, %v", a, b, errAB, errBA, okA, okB)
			}
			if errAB == nil && ab != -ba {
				t.Fatalf("CompareCursors(%q, %q) = %d, reversed %d", a, b, ab, ba)
			}
		}
	})
}
