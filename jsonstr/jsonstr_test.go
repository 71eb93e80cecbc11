package jsonstr

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"
)

// samples are strings that exercise every branch of Append.
var samples = []string{
	"", "a", "orders.42", `"`, `\`, `a"b\c`, "\n\r\t", "\b\f", "\x00\x01\x1f", "\x7f",
	"<>&", "é", "zażółć", "😀", "\u2028\u2029", "\ufffd", "\xff", "a\xffb", "\xc3", "\xc3(",
	"\xed\xa0\x80", "\xf4\x90\x80\x80", "\xc0\x80", "\xe2\x82", "\xe2\x82\xac",
	strings.Repeat("x", 300) + "\"" + strings.Repeat("é", 50),
}

func TestAppend(t *testing.T) {
	for _, s := range samples {
		check(t, s)
	}
	for in, want := range map[string]string{
		"":                            `""`,
		"plain":                       `"plain"`,
		"\"\\/\b\f\n\r\t\x00\x1f\x7f": `"\"\\/\u0008\u000c\n\r\t\u0000\u001f` + "\x7f\"",
		"é😀\u2028":                    "\"é😀\u2028\"",
		"a\xffb\xc3":                  `"a\ufffdb\ufffd"`,
		"\xed\xa0\x80":                `"\ufffd\ufffd\ufffd"`, // a surrogate is not UTF-8
	} {
		if got := AppendBytes(nil, []byte(in)); string(got) != want {
			t.Errorf("AppendBytes(%q) = %s, want %s", in, got, want)
		}
	}
}

func FuzzAppend(f *testing.F) {
	for _, s := range samples {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) { check(t, s) })
}

// check compares Append(s) with encoding/json: the same decoded string
// always, the same bytes where encoding/json's extra escapes (HTML
// characters, \b, \f, U+2028/U+2029) don't apply; and Len and AppendBytes
// with Append.
func check(t testing.TB, s string) {
	t.Helper()
	got := Append([]byte("prefix"), s)
	if !bytes.HasPrefix(got, []byte("prefix")) {
		t.Fatalf("Append(%q) clobbered dst: %q", s, got)
	}
	got = got[len("prefix"):]
	if n := Len(s); n != len(got) {
		t.Fatalf("Len(%q) = %d, Append wrote %d bytes: %q", s, n, len(got), got)
	}
	if b := AppendBytes(nil, []byte(s)); !bytes.Equal(b, got) {
		t.Fatalf("AppendBytes(%q) = %q, Append %q", s, b, got)
	}
	if !json.Valid(got) || !utf8.Valid(got) {
		t.Fatalf("Append(%q) = %q: not valid JSON in UTF-8", s, got)
	}
	if bytes.ContainsAny(got, "\n\r") {
		t.Fatalf("Append(%q) = %q: raw line break", s, got)
	}
	var dec string
	if err := json.Unmarshal(got, &dec); err != nil {
		t.Fatalf("Append(%q) = %q: %v", s, got, err)
	}
	std, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	var stdDec string
	if err := json.Unmarshal(std, &stdDec); err != nil {
		t.Fatal(err)
	}
	if dec != stdDec {
		t.Fatalf("Append(%q) decodes to %q, encoding/json's encoding to %q", s, dec, stdDec)
	}
	if !strings.ContainsAny(s, "\b\f\u2028\u2029") {
		var buf bytes.Buffer
		enc := json.NewEncoder(&buf)
		enc.SetEscapeHTML(false)
		if err := enc.Encode(s); err != nil {
			t.Fatal(err)
		}
		if want := bytes.TrimSuffix(buf.Bytes(), []byte("\n")); !bytes.Equal(got, want) {
			t.Fatalf("Append(%q) = %q, encoding/json = %q", s, got, want)
		}
	}
}
