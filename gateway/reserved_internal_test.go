package gateway

import "testing"

// TestFoldedReserved: the reserved check folds case and width, and a
// pattern written with placeholders counts them as wildcards.
func TestFoldedReserved(t *testing.T) {
	for _, tc := range []struct {
		pattern, subject string
		want             bool
	}{
		{"db.>", "db.orders.1", true},
		{"db.>", "DB.orders.1", true},
		{"db.>", "dB.x", true},
		{"db.>", "\uff44\uff42.x", true},
		{"db.>", "\uff24\uff22.x", true},
		{"k8s.>", "\u212a8s.x", true}, // Kelvin sign
		{"db.>", "dbx.x", false},
		{"db.>", "d.x", false},
		{"db.*", "db.x.y", false},
	} {
		if got := foldMatch(tc.pattern, tc.subject); got != tc.want {
			t.Errorf("foldMatch(%q, %+q) = %v, want %v", tc.pattern, tc.subject, got, tc.want)
		}
	}
	for _, tc := range []struct {
		outer, inner string
		want         bool
	}{
		{"db.>", "DB.audit.>", true},
		{"db.>", "*.audit.>", false},
		{"db.>", ">", false},
		{"db.>", "db.*.>", true},
		{"db.*", "db.>", false},
	} {
		if got := foldContains(tc.outer, tc.inner); got != tc.want {
			t.Errorf("foldContains(%q, %q) = %v, want %v", tc.outer, tc.inner, got, tc.want)
		}
	}
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
