package cdc

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fanwire/fanwire/broker"
	"github.com/jackc/pglogrepl"
	"go.uber.org/zap"
)

// pending is one committed transaction's events (or a bootstrap chunk,
// end 0), or a sync barrier.
type pending struct {
	evs    []broker.Outgoing
	end    pglogrepl.LSN // confirmable once evs are acknowledged
	commit time.Time     // the transaction's commit time (zero for bootstrap chunks)
	done   chan struct{} // sync: closed once everything before is acknowledged
	events int           // what it took from the budget (none for a sync)
	bytes  int64
}

// publisher batches events and publishes them in order, group-commit
// style: an event that finds no publish in flight goes out at once; while
// one is in flight, what arrives meanwhile gathers into the next, so
// batches grow with the load and nothing waits on a timer.
type publisher struct {
	in    *Ingest
	lease *lease       // asked before every publish: a leader that lost its lock publishes nothing
	hw    *highWater   // owned by run: events at or before it are skipped; nil once passed
	last  string       // owned by run: the id of the ingest's last event the broker stores ("" none)
	ch    chan pending // at most 1,024 hand-overs; q bounds their events and bytes
	q     *budget
	acked atomic.Uint64 // end LSN of the last transaction whose events are acknowledged

	stopped func(error) // static: told why run stopped
	mu      sync.Mutex
	failed  error // guarded by mu: why run stopped
	stop    chan struct{}
}

// newPublisher makes the publisher of a run; stopped is called with the
// reason when it stops (a failed publish must end the run at once: the
// reader, waiting for WAL on an idle database, would not notice it).
// last is the id of the ingest's last event the broker stores, as
// LastID said ("" for none): each append is conditional on it, where the
// broker can check (broker.AppendOptions).
func newPublisher(in *Ingest, l *lease, hw *highWater, last string, stopped func(error)) *publisher {
	q := newBudget(in.cfg.QueueEvents, in.cfg.QueueBytes)
	in.queue.Store(q)
	return &publisher{in: in, lease: l, hw: hw, last: last, stopped: stopped, ch: make(chan pending, 1024), q: q, stop: make(chan struct{})}
}

// add queues a transaction's events; it blocks while the queue is full, in
// hand-overs, events or bytes (the reader then stops reading: PostgreSQL
// keeps the WAL).
func (p *publisher) add(ctx context.Context, evs []broker.Outgoing, end pglogrepl.LSN, commit time.Time) error {
	events, bytes := cost(evs)
	if stopped, err := p.q.take(ctx, p.stop, events, bytes); stopped {
		return p.err()
	} else if err != nil {
		return err
	}
	select {
	case p.ch <- pending{evs: evs, end: end, commit: commit, events: events, bytes: bytes}:
		return nil
	case <-p.stop:
		p.q.give(events, bytes)
		return p.err()
	case <-ctx.Done():
		p.q.give(events, bytes)
		return ctx.Err()
	}
}

// sync waits until everything queued before it is acknowledged.
func (p *publisher) sync(ctx context.Context) error {
	done := make(chan struct{})
	select {
	case p.ch <- pending{done: done}:
	case <-p.stop:
		return p.err()
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case <-done:
		return nil
	case <-p.stop:
		return p.err()
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (p *publisher) err() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.failed
}

// run publishes until ctx is done or a publish fails (the reader then
// sees the error, and the ingest reconnects and re-reads from the last
// confirmed LSN: ids make the repeats harmless where the broker dedups).
func (p *publisher) run(ctx context.Context) {
	cfg := &p.in.cfg
	var batch []broker.Outgoing
	var syncs []chan struct{}
	var commits []time.Time
	var events int // taken from the budget by the batch's hand-overs
	var bytes int64
	for {
		var first pending
		select {
		case first = <-p.ch:
		case <-ctx.Done():
			p.fail(ctx.Err())
			return
		}
		batch = append(batch[:0], first.evs...)
		end := first.end
		syncs = syncs[:0]
		commits = append(commits[:0], first.commit)
		events, bytes = first.events, first.bytes
		if first.done != nil {
			syncs = append(syncs, first.done)
		}
		// Group commit: take what is waiting now, and nothing more. A
		// quiet database's event goes out at once; under load, what
		// arrives while one publish is in flight is the next one's batch.
	fill:
		for len(batch) < cfg.MaxBatch && first.done == nil {
			select {
			case n := <-p.ch:
				batch = append(batch, n.evs...)
				end = max(end, n.end)
				commits = append(commits, n.commit)
				events, bytes = events+n.events, bytes+n.bytes
				if n.done != nil {
					syncs = append(syncs, n.done)
					break fill
				}
			default:
				break fill
			}
		}
		out := batch
		if p.hw != nil {
			var passed bool
			if out, passed = p.hw.skip(batch); passed {
				p.in.log.Info("ingest: past the high-water mark", zap.String("id", p.hw.id), zap.Int("skipped", p.hw.skipped))
				p.hw = nil
			}
		}
		// A transaction larger than MaxBatch goes out in slices (the
		// broker client holds one slice's acks at a time); its end is
		// confirmed only after the last.
		step := min(cfg.MaxBatch, fenceEvery)
		for i := 0; i < len(out); i += step {
			slice := out[i:min(i+step, len(out))]
			if err := p.lease.check(ctx); err != nil {
				p.fail(fmt.Errorf("not publishing %d events: %w", len(out)-i, err))
				return
			}
			// A broker that has not acknowledged within PublishTimeout (an
			// outage) ends the run: the next one starts from what the broker
			// says it stores (its high-water mark), which the broker's own
			// retries cannot know once its duplicate window has passed.
			pctx, cancel := context.WithTimeout(ctx, cfg.PublishTimeout)
			var err error
			if a, ok := cfg.Broker.(broker.Appender); ok {
				// No cursors: faster where the broker can. Conditional: a
				// leader that lost its lease, or an earlier part refused,
				// finds the writer's last stored event moved or missing,
				// and its append is refused.
				err = a.Append(pctx, slice, broker.AppendOptions{Writer: p.in.writer, Check: true, Last: p.last, Fence: p.lease.check})
				if err == nil {
					p.last = slice[len(slice)-1].ID
				}
			} else {
				_, err = cfg.Broker.Publish(pctx, slice)
			}
			cancel()
			if err != nil {
				p.fail(fmt.Errorf("broker: %w", err))
				return
			}
			p.in.published.Add(uint64(len(slice)))
		}
		now := time.Now()
		for _, c := range commits {
			if !c.IsZero() {
				p.in.commitToAck.Observe(now.Sub(c).Seconds())
			}
		}
		if end > 0 {
			p.acked.Store(uint64(end))
			p.in.oldest.Store(0) // approximate: the next commit sets it again
		}
		for _, d := range syncs {
			close(d)
		}
		clear(batch)
		p.q.give(events, bytes) // the reader may hand over more
	}
}

func (p *publisher) fail(err error) {
	p.mu.Lock()
	p.failed = err
	p.mu.Unlock()
	close(p.stop)
	if !errors.Is(err, context.Canceled) {
		p.in.log.Warn("ingest: publish failed", zap.Error(err))
	}
	if p.stopped != nil && !errors.Is(err, context.Canceled) { // the run stops it: nothing to tell
		p.stopped(err)
	}
}

// fenceEvery bounds what one Publish call sends, so that the lease is asked
// before each of the broker's writes: JetStream stores a Publish as atomic
// batches of up to 1,000 messages, one after another, and a leader frozen
// between two of them would send the rest on waking, after the new
// leader's events (TestFrozenLeaderPublishesNothingAfterWaking saw a row
// twice under load with 4,096 per call).
const fenceEvery = 1000
