package loadtest

// verifier checks one client's event stream against the published sequence
// 1..events. With several publishers (Config.PublishVia ws or http) the
// sequence is split in per-publisher runs of events/publishers numbers
// (publisher p sends p×per+1..(p+1)×per, in order), and gaps and order are
// checked per publisher, the only order the gateway promises. A view's
// client (Config.Where) gets every stride-th event from offset+1 on: it
// counts those as its own 1, 2, 3… and any other as alien. A bitmap of arrived sequence numbers makes every count exact
// whatever the arrival order; it costs events/8 bytes per client (2.5 KB at
// 20,000 events). A verifier is owned by one reader goroutine.
type verifier struct {
	events uint64   // static after newVerifier
	per    uint64   // static after newVerifier: sequence numbers per publisher
	seen   []uint64 // bit seq-1 is set once seq has arrived
	lastBy []uint64 // highest sequence number seen per publisher; nil with one publisher
	stride uint64   // static after newStrideVerifier: 0 or 1 for every event, else every stride-th
	offset uint64   // static after newStrideVerifier: with stride, the events with seq-1 ≡ offset (mod stride) are ours

	last      uint64 // highest sequence number seen
	distinct  int64  // sequence numbers in 1..events seen at least once
	delivered int64  // every event received, including duplicates and unexpected ones
	gaps      int64  // events skipped over when a later one arrived (seq > last+1 adds seq-last-1)
	dups      int64  // arrivals of a sequence number already seen
	late      int64  // first arrivals of a sequence number below last (out of order)
	alien     int64  // sequence numbers outside 1..events
}

func newVerifier(events int) verifier {
	return verifier{events: uint64(events), per: uint64(events), seen: make([]uint64, (events+63)/64)}
}

// newMultiVerifier checks publishers × per events, per publisher in order.
func newMultiVerifier(publishers, per int) verifier {
	v := newVerifier(publishers * per)
	v.per = uint64(max(per, 1))
	if publishers > 1 {
		v.lastBy = make([]uint64, publishers)
	}
	return v
}

// newStrideVerifier checks the events offset+1, offset+1+stride, … (events
// of them), one view's share of a run's events.
func newStrideVerifier(events, stride, offset int) verifier {
	v := newVerifier(events)
	v.stride, v.offset = uint64(max(stride, 1)), uint64(offset)
	return v
}

// observe records one received event.
func (v *verifier) observe(seq uint64) {
	if v.stride > 1 {
		if seq == 0 || (seq-1)%v.stride != v.offset {
			v.delivered++
			v.alien++
			return
		}
		seq = (seq-1)/v.stride + 1 // our own numbering: 1, 2, 3…
	}
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
	if v.lastBy != nil {
		p := (seq - 1) / v.per
		last := max(v.lastBy[p], p*v.per) // the publisher's run starts after p×per
		switch {
		case seq > last:
			v.gaps += int64(seq - last - 1)
			v.lastBy[p] = seq
		default:
			v.late++
		}
		v.last = max(v.last, seq)
		return
	}
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
