package gateway

import (
	"bytes"
	"time"

	"github.com/fanwire/fanwire/gateway/internal/fanout"
	"github.com/fanwire/fanwire/subject"
)

// Commit → dispatch lag. The ingest's events carry their transaction's
// commit time near the start of their envelope ("commit_time", RFC 3339
// in UTC with up to nine fractional digits; docs/ingest.md). The
// dispatcher reads it from every event on a reserved subject (only the
// ingest, or a credential granted them explicitly, publishes there: a
// client cannot skew the figure) and observes the time from the commit
// to the event's dispatch: what a user waits for a change, but for the
// last hop to the browser. The clocks of the database's host and of the
// node differ by their skew.

// observeCommitLag observes the commit → dispatch lag of the ingest's
// events among evs, about to be dispatched (microseconds before they
// are queued): one clock read per batch.
func (s *Server) observeCommitLag(evs []*fanout.Event) {
	var now time.Time
	for _, ev := range evs {
		if !s.ingestSubject(ev.Subject) {
			continue
		}
		t, ok := commitTime(ev.Data())
		if !ok {
			continue
		}
		if now.IsZero() {
			now = time.Now()
		}
		s.metrics.CommitLag.Observe(max(now.Sub(t), 0).Seconds())
	}
}

// ingestSubject reports whether subject is reserved (Config.ReservedSubjects:
// the ingest's).
func (s *Server) ingestSubject(subj string) bool {
	for _, r := range s.cfg.ReservedSubjects {
		if subject.Match(r, subj) {
			return true
		}
	}
	return false
}

// commitTimeField starts the commit time in an ingest event's envelope.
var commitTimeField = []byte(`"commit_time":"`)

// commitTimeWindow bounds how far into the data the field is looked for:
// the envelope's id, op, key and lsn come before it; a key longer than
// this (a wide composite key) goes unmeasured rather than scanning a big
// document.
const commitTimeWindow = 512

// commitTime reads the commit time of an ingest event's data.
func commitTime(data []byte) (time.Time, bool) {
	head := data[:min(len(data), commitTimeWindow)]
	i := bytes.Index(head, commitTimeField)
	if i < 0 {
		return time.Time{}, false
	}
	return parseUTC(data[i+len(commitTimeField):])
}

// parseUTC parses "2006-01-02T15:04:05[.fraction]Z" at the start of b (the
// ingest's format), without time.Parse's generality.
func parseUTC(b []byte) (time.Time, bool) {
	if len(b) < 20 || b[4] != '-' || b[7] != '-' || b[10] != 'T' || b[13] != ':' || b[16] != ':' {
		return time.Time{}, false
	}
	num := func(s []byte) (int, bool) {
		n := 0
		for _, c := range s {
			if c < '0' || c > '9' {
				return 0, false
			}
			n = n*10 + int(c-'0')
		}
		return n, true
	}
	year, ok1 := num(b[0:4])
	month, ok2 := num(b[5:7])
	day, ok3 := num(b[8:10])
	hour, ok4 := num(b[11:13])
	minute, ok5 := num(b[14:16])
	sec, ok6 := num(b[17:19])
	if !(ok1 && ok2 && ok3 && ok4 && ok5 && ok6) || month < 1 || month > 12 {
		return time.Time{}, false
	}
	i, nsec := 19, 0
	if b[i] == '.' {
		i++
		scale := 100_000_000
		for ; i < len(b) && b[i] >= '0' && b[i] <= '9'; i++ {
			nsec += int(b[i]-'0') * scale
			scale /= 10
		}
	}
	if i >= len(b) || b[i] != 'Z' {
		return time.Time{}, false
	}
	return time.Date(year, time.Month(month), day, hour, minute, sec, nsec, time.UTC), true
}
