package fanout

import (
	"testing"
)

// TestIndexSkipsSystemSubjects: the hub's index gives a system subject
// only to the patterns that write its first token out.
func TestIndexSkipsSystemSubjects(t *testing.T) {
	h := NewHub(HubConfig{})
	c := NewClient(16, 1<<20, func() {})
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
			got = string(ds[0].subs.B)
		} else if len(ds) > 1 {
			t.Fatalf("%s: %d deliveries for one client", subject, len(ds))
		}
		if got != want {
			t.Errorf("%s: delivered to %s, want %s", subject, got, want)
		}
	}
}
