package fanout

// Recent keeps the last events the dispatcher dispatched on a durable
// broker, so that a resuming subscription can be handed over to the live
// feed exactly even while events keep arriving: the events dispatched
// between its last replay and the moment it holds the index (the gap) are
// taken from here instead of another replay round, which on a busy stream
// would never catch up.
//
// Written by the dispatcher while it holds the index for reading; read by
// a resume while it holds the index for writing. Those exclude each other.
type Recent struct {
	ring  []*Event // capacity recentCap once used
	next  int      // where the next event goes
	full  bool
	floor string // cursor of the newest event no longer in the ring (or the feed's start): the ring holds everything after it
}

// recentCap bounds the gap a hand-over can close without replaying again.
const recentCap = 4096

// Add records ev, the newest event dispatched.
func (r *Recent) Add(ev *Event) {
	if r.ring == nil {
		r.ring = make([]*Event, recentCap)
	}
	if old := r.ring[r.next]; old != nil {
		r.floor = old.Cursor
		r.full = true
	}
	r.ring[r.next] = ev
	r.next = (r.next + 1) % recentCap
}

// After returns the events with cursors after w, oldest first, and whether
// the ring covers everything after w. cmp orders cursors.
func (r *Recent) After(w string, cmp func(a, b string) (int, error)) ([]*Event, bool) {
	if r.floor != "" && w != r.floor {
		if o, err := cmp(w, r.floor); err != nil || o < 0 {
			return nil, false // events after w were evicted
		}
	}
	n := r.next
	if r.full {
		n = recentCap
	}
	var out []*Event
	for i := 1; i <= n; i++ {
		ev := r.ring[(r.next-i+recentCap)%recentCap]
		if ev == nil {
			break
		}
		if w != "" {
			if o, err := cmp(ev.Cursor, w); err != nil || o <= 0 {
				break
			}
		}
		out = append(out, ev)
	}
	for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
		out[i], out[j] = out[j], out[i]
	}
	return out, true
}

// Floor is the cursor of the newest event no longer in the ring (or the
// feed's start): the ring holds every event after it.
func (r *Recent) Floor() string { return r.floor }

// SetFloor sets where the feed starts, before the first Add.
func (r *Recent) SetFloor(cursor string) { r.floor = cursor }
