package jsonstr

import (
	"unicode/utf8"
	"unsafe"
)

const hexDigits = "0123456789abcdef"

// Append appends s as a JSON string.
func Append(dst []byte, s string) []byte {
	dst = append(dst, '"')
	start := 0 // s[start:i] is pending, to be copied as is
	for i := 0; i < len(s); {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' && c < utf8.RuneSelf {
			i++
			continue
		}
		if c >= utf8.RuneSelf {
			r, size := utf8.DecodeRuneInString(s[i:])
			if r == utf8.RuneError && size == 1 {
				dst = append(dst, s[start:i]...)
				dst = append(dst, `\ufffd`...)
				i++
				start = i
				continue
			}
			i += size
			continue
		}
		dst = append(dst, s[start:i]...)
		switch c {
		case '"', '\\':
			dst = append(dst, '\\', c)
		case '\n':
			dst = append(dst, '\\', 'n')
		case '\r':
			dst = append(dst, '\\', 'r')
		case '\t':
			dst = append(dst, '\\', 't')
		default:
			dst = append(dst, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
		}
		i++
		start = i
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}

// AppendBytes is Append for a byte slice, without copying it.
func AppendBytes(dst []byte, s []byte) []byte {
	return Append(dst, unsafe.String(unsafe.SliceData(s), len(s)))
}

// Len is len(Append(nil, s)), so that buffers are sized exactly.
func Len(s string) int {
	n := 2
	for i := 0; i < len(s); {
		c := s[i]
		switch {
		case c >= 0x20 && c != '"' && c != '\\' && c < utf8.RuneSelf:
			n++
			i++
		case c == '"' || c == '\\' || c == '\n' || c == '\r' || c == '\t':
			n += 2
			i++
		case c < utf8.RuneSelf:
			n += 6
			i++
		default:
			r, size := utf8.DecodeRuneInString(s[i:])
			if r == utf8.RuneError && size == 1 {
				n += len(`\ufffd`) // an invalid byte becomes U+FFFD, escaped
			} else {
				n += size
			}
			i += size
		}
	}
	return n
}
