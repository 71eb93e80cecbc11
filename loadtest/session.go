package loadtest

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// session keeps connected clients read for as long as a measurement
// holds them open (Idle, Latest's live client): each client's reader
// (client.read, as in Run) answers the gateway's pings, which an
// unread connection never does (the gateway closes it for ping_timeout,
// 40 s in by default), and verifies whatever arrives. It owns the
// readers: close stops them, waits for them and only then reads their
// tallies.
type session struct {
	cfg      *Config   // static
	clients  []*client // static; their tallies are the readers' until close
	stop     context.CancelFunc
	wg       sync.WaitGroup
	finished chan struct{} // one send per reader: its client holds every event, or its connection ended
}

// startSession starts a reader for each client; ctx ending closes the
// connections at once, close closes them with a handshake.
func startSession(ctx context.Context, cfg *Config, clients []*client) *session {
	stopCtx, stop := context.WithCancel(ctx)
	s := &session{cfg: cfg, clients: clients, stop: stop, finished: make(chan struct{}, len(clients))}
	for _, c := range clients {
		s.wg.Go(func() { c.read(ctx, stopCtx, s.finished) })
	}
	return s
}

// deliver publishes cfg.Events events (a view run's documents: each to
// its one client) and waits until every client holds all of its own (or
// its connection ended: close reports it), failing when delivery makes no
// progress for cfg.Timeout. Call it at most once.
func (s *session) deliver(ctx context.Context) error {
	out, err := openSink(ctx, s.cfg)
	if err != nil {
		return err
	}
	defer out.close()
	pctx, cancel := context.WithCancel(ctx)
	var pw sync.WaitGroup
	defer pw.Wait() // after cancel (defers run last-in first-out)
	defer cancel()
	published := make(chan error, 1) // the one send never blocks
	pw.Go(func() { published <- publish(pctx, out, s.cfg, nil) })
	m := monitor{cfg: s.cfg, clients: s.clients, start: time.Now()}
	if err := m.wait(ctx, s.finished, published); err != nil {
		return err
	}
	if m.timedOut {
		return fmt.Errorf("no delivery for %v: %d of %d events delivered", s.cfg.Timeout, m.delivered(), s.cfg.expectedTotal())
	}
	if m.published == 0 { // every client finished before the publisher's result came
		select {
		case err := <-published:
			if err != nil {
				return fmt.Errorf("publish: %w", err)
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// close stops the readers (closing each connection with a handshake),
// waits for them, and reports the first client whose stream was not
// exactly its events (all of them when complete is set, none missing),
// or whose connection ended early.
func (s *session) close(complete bool) error {
	s.stop()
	s.wg.Wait()
	bad, first := 0, ""
	for _, c := range s.clients {
		v := &c.v
		if (complete && !v.complete()) || v.gaps+v.dups+v.late+v.alien+c.malformed+c.leaves+c.serverErrors > 0 || c.err != nil {
			if bad++; first == "" {
				first = fmt.Sprintf("client %d: %d of %d events, gaps %d, dups %d, out of order %d, unexpected %d, leaves %d, errors %d %s",
					c.id, v.distinct, v.events, v.gaps, v.dups, v.late, v.alien, c.leaves, c.serverErrors, c.firstServerError)
				if c.err != nil {
					first += ", ended: " + c.err.Error()
				}
			}
		}
	}
	if bad > 0 {
		return fmt.Errorf("%d of %d clients did not get exactly their events; first: %s", bad, len(s.clients), first)
	}
	return nil
}
