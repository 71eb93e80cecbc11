package loadtest

import (
	"fmt"
	"testing"
)

// TestViewRunLayout checks how a view run lays its events out: which
// document (subject) and customer each event is, what each client
// subscribes to, and that every event is exactly one client's.
func TestViewRunLayout(t *testing.T) {
	cfg := Config{Subject: "loadtest.x.hot", Clients: 3, Events: 14, Where: WhereEq}
	if err := cfg.setDefaults(); err != nil {
		t.Fatal(err)
	}
	if cfg.WhereDocs != 1 {
		t.Fatalf("WhereDocs default = %d, want 1", cfg.WhereDocs)
	}
	cfg.WhereDocs = 2 // 6 documents: customer k's rows are documents k and k+3
	var got []string
	for seq := uint64(1); seq <= 7; seq++ {
		got = append(got, string(cfg.appendDocSubject(nil, seq)))
	}
	want := "[loadtest.x.hot.0.0 loadtest.x.hot.1.0 loadtest.x.hot.2.0 loadtest.x.hot.0.1 loadtest.x.hot.1.1 loadtest.x.hot.2.1 loadtest.x.hot.0.0]"
	if fmt.Sprint(got) != want {
		t.Errorf("subjects = %v, want %s", got, want)
	}
	total := 0
	for i := range cfg.Clients {
		total += cfg.clientEvents(i)
		v := cfg.newClientVerifier(i)
		for seq := uint64(1); seq <= uint64(cfg.Events); seq++ {
			if k, _ := cfg.docOf(seq); int(k) == i {
				v.observe(seq)
			}
		}
		if !v.complete() || v.gaps+v.dups+v.late+v.alien != 0 {
			t.Errorf("client %d: its customer's events do not make a clean stream: %+v", i, v)
		}
	}
	if total != cfg.Events || cfg.expectedTotal() != int64(cfg.Events) {
		t.Errorf("clients expect %d events in all (expectedTotal %d), want each of %d once", total, cfg.expectedTotal(), cfg.Events)
	}
	for _, tt := range []struct {
		where string
		want  subscription
	}{
		{WhereEq, subscription{subject: "loadtest.x.hot.*.*", where: "doc.customer_id == 2"}},
		{WhereRange, subscription{subject: "loadtest.x.hot.*.*", where: "doc.total >= 2 && doc.total < 3"}},
		{WhereSubject, subscription{subject: "loadtest.x.hot.2.*"}},
		{"", subscription{subject: "loadtest.x.hot"}},
	} {
		cfg.Where = tt.where
		if got := cfg.clientSub(2); got != tt.want {
			t.Errorf("where %q: client 2 subscribes %+v, want %+v", tt.where, got, tt.want)
		}
	}
}
