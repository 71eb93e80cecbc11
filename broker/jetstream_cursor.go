package broker

// JetStream cursors: "js:<stream sequence>".

import (
	"cmp"
	"fmt"
	"strconv"
	"strings"
)

// CursorPrefixJS starts every JetStream cursor.
const CursorPrefixJS = "js:"

// FormatJSCursor returns the cursor of stream sequence seq.
func FormatJSCursor(seq uint64) string { return CursorPrefixJS + strconv.FormatUint(seq, 10) }

// ParseJSCursor returns the stream sequence of a JetStream cursor.
func ParseJSCursor(c string) (uint64, error) {
	s, ok := strings.CutPrefix(c, CursorPrefixJS)
	if !ok {
		return 0, fmt.Errorf("%w: %q is not a JetStream cursor (js:<sequence>)", ErrBadCursor, c)
	}
	seq, err := strconv.ParseUint(s, 10, 64)
	if err != nil || seq == 0 || (len(s) > 1 && s[0] == '0') {
		return 0, fmt.Errorf("%w: %q: the sequence must be a positive decimal integer", ErrBadCursor, c)
	}
	return seq, nil
}

// CompareCursors orders two JetStream cursors.
func (b *JetStream) CompareCursors(x, y string) (int, error) {
	a, err := ParseJSCursor(x)
	if err != nil {
		return 0, err
	}
	c, err := ParseJSCursor(y)
	if err != nil {
		return 0, err
	}
	return cmp.Compare(a, c), nil
}
