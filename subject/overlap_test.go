package subject_test

import (
	"testing"

	"github.com/fanwire/fanwire/subject"
)

func TestOverlap(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		a, b string
		want bool
	}{
		{"db.orders.*", "db.orders.*", true},
		{"db.orders.*", "db.customers.*", false},
		{"db.orders.*", "db.orders.42", true},
		{"db.orders.*", "db.sales.orders.*", false},
		{"db.sales.*", "db.sales.orders.*", false},
		{"db.>", "db.orders.*", true},
		{"db.>", "db", false},
		{"db.*.42", "db.orders.*", true},
		{"db.%errors.orders", "db.*.orders", true},
		{"db.%errors.orders", "db.%errors.customers", false},
		{"db.orders.>", "db.orders.x.y", true},
		{"app.>", "db.>", false},
		{"db.orders", "db.orders.*", false},
	} {
		if got := subject.Overlap(c.a, c.b); got != c.want {
			t.Errorf("Overlap(%q, %q) = %v, want %v", c.a, c.b, got, c.want)
		}
		if got := subject.Overlap(c.b, c.a); got != c.want {
			t.Errorf("Overlap(%q, %q) = %v, want %v", c.b, c.a, got, c.want)
		}
	}
}
