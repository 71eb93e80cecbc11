package loadtest

import (
	"strings"
	"testing"
	"time"
)

func TestMedian(t *testing.T) {
	for _, tt := range []struct {
		xs   []float64
		want float64
	}{{nil, 0}, {[]float64{3}, 3}, {[]float64{5, 1, 3}, 3}, {[]float64{4, 1, 3, 2}, 2.5}} {
		if got := median(tt.xs); got != tt.want {
			t.Errorf("median(%v) = %v, want %v", tt.xs, got, tt.want)
		}
	}
}

// TestLatestResultSummary: medians are taken per kind of read, and a read
// that was not clean fails the result and says why.
func TestLatestResultSummary(t *testing.T) {
	r := &LatestResult{Docs: 1000, OK: true, Reads: []LatestRead{
		{Kind: readSnapshot, Time: time.Second, DocsPerSec: 1000, GatewayCPUSeconds: 0.5, Received: 1000, OK: true},
		{Kind: readReplay, Time: time.Second / 2, DocsPerSec: 2000, GatewayCPUSeconds: 0.2, Received: 1000, OK: true},
		{Kind: readReplay, Time: time.Second / 4, DocsPerSec: 4000, GatewayCPUSeconds: 0.1, Received: 1000, OK: true},
		{Kind: readSnapshot, Time: time.Second / 2, DocsPerSec: 2000, GatewayCPUSeconds: 0.3, Received: 999, Missing: 1},
		{Kind: readSnapshot, Time: time.Second / 3, DocsPerSec: 3000, GatewayCPUSeconds: 0.4, Received: 1000, OK: true},
	}}
	r.OK = false // the fourth read
	r.summarize()
	if r.SnapshotDocsPerSec != 2000 || r.ReplayDocsPerSec != 3000 || r.SnapshotCPUMicrosPerDoc != 400 || r.ReplayCPUMicrosPerDoc != 150 {
		t.Errorf("medians: snapshot %v/s %v µs, replay %v/s %v µs; want 2000, 400, 3000, 150",
			r.SnapshotDocsPerSec, r.SnapshotCPUMicrosPerDoc, r.ReplayDocsPerSec, r.ReplayCPUMicrosPerDoc)
	}
	var out strings.Builder
	r.WriteTable(&out)
	if !strings.Contains(out.String(), "missing 1") || !strings.Contains(out.String(), "result                      FAIL") {
		t.Errorf("table:\n%s", out.String())
	}
}
