package gateway

import (
	"testing"
	"time"

	"github.com/fanwire/fanwire/gateway/internal/fanout"
)

// TestCommitTime: the commit time is read from an ingest event's
// envelope as time.Parse reads it, whatever its fraction's digits, and
// nothing is read from data without one, a malformed one, or one past
// the window.
func TestCommitTime(t *testing.T) {
	for _, s := range []string{
		"2026-11-30T17:00:00Z", "2026-11-30T17:00:00.1Z", "2026-11-30T17:00:00.123456Z",
		"2026-02-28T23:59:59.999999999Z", "1999-12-31T00:00:00.000001Z",
	} {
		data := []byte(`{"id":"fanwire.1:16b3748-0","op":"update","key":42,"lsn":"0/16B3748","commit_time":"` + s + `","doc":{"id":42}}`)
		got, ok := commitTime(data)
		want, err := time.Parse(time.RFC3339Nano, s)
		if err != nil || !ok || !got.Equal(want) {
			t.Errorf("%s: got %v %v, want %v", s, got, ok, want)
		}
	}
	for _, data := range []string{
		`{"id":1}`,
		`{"commit_time":"2026-11-30T17:00:00+01:00"}`,
		`{"commit_time":"2026-13-30T17:00:00Z"}`,
		`{"commit_time":"2026-11-30 17:00:00Z"}`,
		`{"commit_time":"2026-11-30T17:00:00.12`,
		`{"key":"` + string(make([]byte, commitTimeWindow)) + `","commit_time":"2026-11-30T17:00:00Z"}`,
	} {
		if got, ok := commitTime([]byte(data)); ok {
			t.Errorf("%.60q: read %v", data, got)
		}
	}
}

// BenchmarkCommitLag: the dispatcher's cost per ingest event for the
// lag histogram (the scan, the parse, the observation).
func BenchmarkCommitLag(b *testing.B) {
	s := &Server{cfg: Config{ReservedSubjects: DefaultReservedSubjects}, metrics: newMetrics(nil, func() bool { return true })}
	ev, err := fanout.NewEvent("db.orders.42", "js:1", []byte(`{"id":"fanwire.1mm4yo2xuwx5w:16b3748-0","op":"update","key":42,"lsn":"0/16B3748","commit_time":"2026-11-30T17:00:00.123456Z","doc":{"id":42,"status":"paid","total":"19.90"}}`))
	if err != nil {
		b.Fatal(err)
	}
	evs := []*fanout.Event{ev}
	b.ReportAllocs()
	for b.Loop() {
		s.observeCommitLag(evs)
	}
}
