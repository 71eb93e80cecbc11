package gateway

import (
	"testing"
)

// TestMatchEvent: a pattern whose first token is a wildcard never matches
// a system subject ($…, _INBOX); one that writes the token out does;
// everything else is MatchSubject.
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
		if got := matchEvent(tc.pattern, tc.subject); got != tc.want {
			t.Errorf("matchEvent(%q, %q) = %v, want %v", tc.pattern, tc.subject, got, tc.want)
		}
	}
	if n := testing.AllocsPerRun(100, func() {
		_ = matchEvent(">", "$JS.API.INFO")
		_ = matchEvent("orders.*", "orders.1")
		_ = isSystemSubject("_INBOX.x")
	}); n != 0 {
		t.Fatalf("matchEvent allocates %v times", n)
	}
}

// TestIndexSkipsSystemSubjects: the hub's index gives a system subject
// only to the patterns that write its first token out.
func TestIndexSkipsSystemSubjects(t *testing.T) {
	h := newHub(nil, 0)
	c := newClient(16, 1<<20, func() {})
	for id, p := range map[string]string{"all": ">", "two": "*.>", "star": "*.API.INFO", "js": "$JS.>", "exact": "$JS.API.INFO"} {
		h.idx.add(c, id, p)
	}
	var m matcher
	for subject, want := range map[string]string{
		"$JS.API.INFO": `["exact","js"]`,
		"_INBOX.x":     "",
		"app.API.INFO": `["all","star","two"]`,
	} {
		h.idx.mu.RLock()
		ds := m.match(h.idx, subject)
		h.idx.mu.RUnlock()
		got := ""
		if len(ds) == 1 {
			got = string(ds[0].subs.b)
		} else if len(ds) > 1 {
			t.Fatalf("%s: %d deliveries for one client", subject, len(ds))
		}
		if got != want {
			t.Errorf("%s: delivered to %s, want %s", subject, got, want)
		}
	}
}
