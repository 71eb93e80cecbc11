package gateway_test

import (
	"testing"
	"time"
)

// TestCommitLagMetric: an ingest event (on a reserved subject, with its
// commit time) is observed in fanwire_commit_to_dispatch_seconds from its
// commit; the same field on another subject, where any client may
// publish, is not.
func TestCommitLagMetric(t *testing.T) {
	e := newEnv(t, nil)
	c := e.dial()
	c.subscribe("s", ">")
	commit := time.Now().Add(-2 * time.Second).UTC().Format(time.RFC3339Nano)
	e.publish("db.orders.1", `{"id":"w:1-0","op":"update","key":1,"lsn":"0/1","commit_time":"`+commit+`","doc":{"id":1}}`)
	e.publish("chat.1", `{"commit_time":"2000-01-01T00:00:00Z"}`)
	c.expect(map[string]any{"type": "event", "subject": "db.orders.1"})
	c.expect(map[string]any{"type": "event", "subject": "chat.1"})
	mfs, err := e.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "fanwire_commit_to_dispatch_seconds" {
			continue
		}
		h := mf.GetMetric()[0].GetHistogram()
		if h.GetSampleCount() != 1 || h.GetSampleSum() < 2 || h.GetSampleSum() > 60 {
			t.Fatalf("commit lag: %d samples summing %v s, want the ingest event's one, about 2 s", h.GetSampleCount(), h.GetSampleSum())
		}
		return
	}
	t.Fatal("fanwire_commit_to_dispatch_seconds is not exported")
}
