package auth

import "testing"

// TestWrittenPattern: a pattern written with placeholders counts them as
// wildcards.
func TestWrittenPattern(t *testing.T) {
	for p, want := range map[string]string{
		"{tenant}.orders.>":  "*.orders.>",
		"db.{tenant}.>":      "db.*.>",
		"db.x{tenant}.>":     "db.*.>",
		"db.audit.>":         "db.audit.>",
		"{a}.{b}":            "*.*",
		"chat.{sub}-{room}":  "chat.*",
		"db.{not a claim}.>": "db.{not a claim}.>",
	} {
		if got := writtenPattern(p); got != want {
			t.Errorf("writtenPattern(%q) = %q, want %q", p, got, want)
		}
	}
}
