package loadtest

// verifier checks one client's event stream against the published sequence
// 1..events. A bitmap of arrived sequence numbers makes every count exact
// whatever the arrival order; it costs events/8 bytes per client (2.5 KB at
// 20,000 events). A verifier is owned by one reader goroutine.
type verifier struct {
	events uint64   // static after newVerifier
	seen   []uint64 // bit seq-1 is set once seq has arrived

	last      uint64 // highest sequence number seen
	distinct  int64  // sequence numbers in 1..events seen at least once
	delivered int64  // every event received, including duplicates and unexpected ones
	gaps      int64  // events skipped over when a later one arrived (seq > last+1 adds seq-last-1)
	dups      int64  // arrivals of a sequence number already seen
	late      int64  // first arrivals of a sequence number below last (out of order)
	alien     int64  // sequence numbers outside 1..events
}

func newVerifier(events int) verifier {
	return verifier{events: uint64(events), seen: make([]uint64, (events+63)/64)}
}

// observe records one received event.
func (v *verifier) observe(seq uint64) {
	v.delivered++
	if seq == 0 || seq > v.events {
		v.alien++
		return
	}
	w, bit := (seq-1)/64, uint64(1)<<((seq-1)%64)
	if v.seen[w]&bit != 0 {
		v.dups++
		return
	}
	v.seen[w] |= bit
	v.distinct++
	switch {
	case seq > v.last:
		v.gaps += int64(seq - v.last - 1)
		v.last = seq
	default:
		v.late++
	}
}

// complete reports whether every published event has arrived.
func (v *verifier) complete() bool { return uint64(v.distinct) == v.events }

// missing is the number of published events that never arrived.
func (v *verifier) missing() int64 { return int64(v.events) - v.distinct }
