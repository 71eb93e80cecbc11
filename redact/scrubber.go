package redact

import (
	"io"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"unicode/utf8"
)

// MinSecret is the shortest secret a Scrubber replaces: a shorter one
// would mask common letters throughout the logs. Such a secret is still
// redacted where fanwire names a URL (URL, NATSURL).
const MinSecret = 3

// Scrubber replaces known secrets with Mask in text fanwire writes: log
// lines and start-up errors. Each secret is looked for as given, URL
// encoded and decoded (a library may print either), and each of those
// Go-quoted (%q in an error) and JSON-escaped (a log field), so a
// password of `a"b/c%` is found in `"redis://:a\"b/c%@h"` too.
type Scrubber struct {
	mu      sync.Mutex                       // serializes Add
	secrets []string                         // guarded by mu: as added
	r       atomic.Pointer[strings.Replacer] // swapped by Add; nil: no secret
}

// NewScrubber returns a Scrubber of secrets (empty ones and ones shorter
// than MinSecret are ignored).
func NewScrubber(secrets ...string) *Scrubber {
	s := &Scrubber{}
	s.Add(secrets...)
	return s
}

// Add adds secrets, e.g. keys read from a file after start.
func (s *Scrubber) Add(secrets ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, v := range secrets {
		if len(v) >= MinSecret && !slices.Contains(s.secrets, v) {
			s.secrets = append(s.secrets, v)
		}
	}
	forms := map[string]bool{}
	for _, v := range s.secrets {
		for _, f := range variants(v) {
			if len(f) >= MinSecret {
				forms[f] = true
			}
		}
	}
	if len(forms) == 0 {
		return
	}
	// Longest first: strings.Replacer tries its old strings in argument
	// order at each position, so a longer form (the escaped one) wins
	// over a shorter one it contains.
	list := make([]string, 0, len(forms))
	for f := range forms {
		list = append(list, f)
	}
	slices.SortFunc(list, func(a, b string) int { return len(b) - len(a) })
	pairs := make([]string, 0, 2*len(list))
	for _, f := range list {
		pairs = append(pairs, f, Mask)
	}
	s.r.Store(strings.NewReplacer(pairs...))
}

// String returns text with every secret masked.
func (s *Scrubber) String(text string) string {
	if s == nil {
		return text
	}
	r := s.r.Load()
	if r == nil {
		return text
	}
	return r.Replace(text)
}

// Writer returns a writer that masks the secrets in each Write before
// passing it on to w. A secret split across two writes is not found:
// give it whole lines (zap writes each entry in one call).
func (s *Scrubber) Writer(w io.Writer) io.Writer {
	if s == nil {
		return w
	}
	return scrubWriter{s: s, w: w}
}

type scrubWriter struct {
	s *Scrubber
	w io.Writer
}

func (sw scrubWriter) Write(p []byte) (int, error) {
	r := sw.s.r.Load()
	if r == nil {
		return sw.w.Write(p)
	}
	if _, err := io.WriteString(sw.w, r.Replace(string(p))); err != nil {
		return 0, err
	}
	return len(p), nil
}

// Sync lets the writer stand as a zapcore.WriteSyncer.
func (sw scrubWriter) Sync() error {
	if f, ok := sw.w.(interface{ Sync() error }); ok {
		return f.Sync()
	}
	return nil
}

// variants are the forms of v a message may hold.
func variants(v string) []string {
	base := []string{v, url.QueryEscape(v), url.PathEscape(v), url.UserPassword("u", v).String()[2:]}
	if d, err := url.PathUnescape(v); err == nil {
		base = append(base, d)
	}
	if d, err := url.QueryUnescape(v); err == nil {
		base = append(base, d)
	}
	var out []string
	for _, b := range base {
		q := strconv.Quote(b)
		q = q[1 : len(q)-1]
		out = append(out, b, q, jsonEscape(b), jsonEscape(q))
	}
	return out
}

// jsonEscape escapes s as zap's JSON encoder writes a string's inside:
// backslash, quote and control characters.
func jsonEscape(s string) string {
	var b strings.Builder
	for _, r := range s {
		switch {
		case r == '\\' || r == '"':
			b.WriteByte('\\')
			b.WriteRune(r)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r == '\t':
			b.WriteString(`\t`)
		case r < 0x20:
			b.WriteString(`\u00`)
			b.WriteByte("0123456789abcdef"[r>>4])
			b.WriteByte("0123456789abcdef"[r&0xf])
		case r == utf8.RuneError:
			b.WriteString(`\ufffd`)
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}
