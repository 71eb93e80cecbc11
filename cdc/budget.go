package cdc

import (
	"context"
	"sync"
	"unsafe"

	"github.com/fanwire/fanwire/broker"
)

// budget bounds what the reader has handed the publisher and the broker
// has not acknowledged yet, in events and in bytes (Config.QueueEvents,
// Config.QueueBytes). The reader takes a hand-over's share before queueing
// it and waits while it does not fit; the publisher gives it back once
// the broker has acknowledged the batch it went out in. So the queue,
// the batch being filled and the publish in flight together stay under
// both bounds, whatever the size of the hand-overs (a bootstrap chunk is
// up to 10,000 events, a transaction's slice MaxBatch).
//
// There is one taker at a time (the bootstrap, then the reader: both run
// on runOnce's goroutine) and one giver (the publisher), so a one-slot
// wake-up channel loses no wake-up.
type budget struct {
	maxEvents int           // static after newBudget
	maxBytes  int64         // static after newBudget
	freed     chan struct{} // one slot: a give wakes a waiting take

	mu     sync.Mutex
	events int   // guarded by mu: taken and not given back
	bytes  int64 // guarded by mu
}

func newBudget(events int, bytes int64) *budget {
	return &budget{maxEvents: events, maxBytes: bytes, freed: make(chan struct{}, 1)}
}

// outgoingSize is what one queued event costs beyond its strings' and
// data's bytes: the broker.Outgoing itself.
const outgoingSize = int64(unsafe.Sizeof(broker.Outgoing{}))

// cost is what a hand-over of evs takes from the budget. A hand-over
// without events (a transaction of unpublished tables, which still
// confirms its end) counts as one event, so that the count of events
// taken is zero only when nothing is queued.
func cost(evs []broker.Outgoing) (events int, bytes int64) {
	for i := range evs {
		bytes += outgoingSize + int64(len(evs[i].Data)+len(evs[i].Subject)+len(evs[i].ID))
	}
	return max(1, len(evs)), bytes
}

// take waits until events and bytes fit, and takes them. A hand-over
// larger than a bound is let through when nothing else is taken: it
// could never fit, and waiting for an empty queue still bounds the
// memory to that one hand-over. It returns stop's or ctx's end.
func (b *budget) take(ctx context.Context, stop <-chan struct{}, events int, bytes int64) (stopped bool, err error) {
	for {
		b.mu.Lock()
		if b.events == 0 || (b.events+events <= b.maxEvents && b.bytes+bytes <= b.maxBytes) {
			b.events += events
			b.bytes += bytes
			b.mu.Unlock()
			return false, nil
		}
		b.mu.Unlock()
		select {
		case <-b.freed:
		case <-stop:
			return true, nil
		case <-ctx.Done():
			return false, ctx.Err()
		}
	}
}

// give returns what take took, once the events are acknowledged (or
// given up).
func (b *budget) give(events int, bytes int64) {
	if events == 0 {
		return
	}
	b.mu.Lock()
	b.events -= events
	b.bytes -= bytes
	b.mu.Unlock()
	select {
	case b.freed <- struct{}{}:
	default: // a wake-up is already pending
	}
}

// used reports what is taken.
func (b *budget) used() (events int, bytes int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.events, b.bytes
}
