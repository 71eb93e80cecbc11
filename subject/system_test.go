package subject

import "testing"

// TestMatchEvent: a pattern whose first token is a wildcard never matches
// a system subject ($…, _INBOX); one that writes the token out does;
// everything else is Match.
func TestMatchEvent(t *testing.T) {
	for _, tc := range []struct {
		pattern, subject string
		want             bool
	}{
		{">", "$JS.API.INFO", false},
		{"*.>", "$JS.API.INFO", false},
		{"*.API.INFO", "$JS.API.INFO", false},
		{"*", "$SYS", false},
		{">", "_INBOX.abc", false},
		{"*.abc", "_INBOX.abc", false},
		{"$JS.>", "$JS.API.INFO", true},
		{"$JS.*.INFO", "$JS.API.INFO", true},
		{"_INBOX.>", "_INBOX.abc", true},
		{">", "_INBOXES.abc", true}, // not the inbox token
		{">", "_inbox.abc", true},
		{">", "a.$JS", true}, // only the first token counts
		{"*.>", "orders.1", true},
		{"orders.*", "orders.1", true},
		{"orders.*", "orders.1.2", false},
	} {
		if got := MatchEvent(tc.pattern, tc.subject); got != tc.want {
			t.Errorf("MatchEvent(%q, %q) = %v, want %v", tc.pattern, tc.subject, got, tc.want)
		}
	}
	if n := testing.AllocsPerRun(100, func() {
		_ = MatchEvent(">", "$JS.API.INFO")
		_ = MatchEvent("orders.*", "orders.1")
		_ = IsSystem("_INBOX.x")
	}); n != 0 {
		t.Fatalf("MatchEvent allocates %v times", n)
	}
}
