package subject

import "testing"

// TestFold: matching and containment fold case and width.
func TestFold(t *testing.T) {
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
		if got := FoldMatch(tc.pattern, tc.subject); got != tc.want {
			t.Errorf("FoldMatch(%q, %+q) = %v, want %v", tc.pattern, tc.subject, got, tc.want)
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
		if got := FoldContains(tc.outer, tc.inner); got != tc.want {
			t.Errorf("FoldContains(%q, %q) = %v, want %v", tc.outer, tc.inner, got, tc.want)
		}
	}
}
