package loadtest

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/coder/websocket"
)

// stormClient is one client's part in a reconnect storm (Config.StormURL):
// where it is, its backoff and its tallies. It hangs off the client's
// reconnector and, like it, is owned by the client's reader goroutine;
// Run reads it after the reader has exited. Only the storm's shared
// counters are touched by other goroutines.
type stormClient struct {
	storm *storm  // static: the run's storm, whose counters it bumps
	node  *Config // static: the run's Config with URL node B's

	bo      backoff   // fanwire.js's policy
	cursor  []byte    // the cursor of the last event processed, copied once per frame
	readyAt time.Time // when the current connection subscribed
	onA     bool      // connected to node A (the clients start there)

	// Milestones, unix ns; 0 until reached. left: the connection to node
	// A ended; back: subscribed again on node B; caught: holding, on node
	// B, every event published until it was back.
	left, back, caught int64
	closeCode          websocket.StatusCode // how the connection to node A ended; -1: not a close frame

	attempts     int    // dials to node B, successful or not
	refusals     int    // answered with an HTTP status (503, 429) instead of an upgrade
	failures     int    // other failed dials and handshakes
	firstFailure string // the first refusal's or failure's error
}

// newStormClient returns client id's part in storm s; it starts on node A,
// subscribed at readyAt.
func newStormClient(s *storm, id int, readyAt time.Time) *stormClient {
	return &stormClient{storm: s, node: s.node, bo: newBackoff(s.cfg.StormSeed, id), readyAt: readyAt, onA: true, closeCode: -1}
}

// caughtUp marks the client caught up on node B at now (unix ns), once.
func (s *stormClient) caughtUp(now int64) {
	if s.back != 0 && s.caught == 0 {
		s.caught = now
		s.storm.caught.Add(1)
	}
}

// rejoin replaces c's ended connection (cause says how it ended) with one
// to node B, as fanwire.js would: after each backoff wait it dials and
// subscribes again from the cursor of the last event c processed, until
// that succeeds or stop ends. A refused upgrade (503 max_connections, 429
// max_connections_per_ip) and a failed dial or handshake are retried;
// an error reply to the subscribe (such as bad_cursor) is not, as no wait
// would change it. It returns the messages that followed "subscribed" in
// its frame.
func (c *client) rejoin(stop context.Context, cause error) ([]byte, error) {
	r, s := c.rc, c.rc.st
	dropped := time.Now()
	_ = c.conn.CloseNow()
	if s.onA {
		s.onA = false
		s.left = dropped.UnixNano()
		s.closeCode = websocket.CloseStatus(cause)
	}
	if len(s.cursor) > 0 {
		r.cursor = string(s.cursor)
	}
	if r.cursor == "" {
		return nil, fmt.Errorf("%w: no cursor to resume from (the events carry none)", ErrNotDurable)
	}
	if r.behindSince == 0 {
		r.behindSince = dropped.UnixNano()
	}
	r.behindUntil = max(r.behindUntil, uint64(r.sent.Load()))
	s.bo.connected(s.readyAt, dropped)
	sub := r.cfg.clientSub(c.id)
	sub.from = r.cursor
	for {
		t := time.NewTimer(s.bo.next())
		select {
		case <-t.C:
		case <-stop.Done():
			t.Stop()
			return nil, stop.Err()
		}
		conn, rest, err := s.open(stop, sub)
		s.attempts++
		if err == nil {
			c.conn = conn
			now := time.Now()
			s.readyAt = now
			r.reconnects++
			r.reconnectTime += now.Sub(dropped)
			if s.back == 0 {
				s.back = now.UnixNano()
				s.storm.back.Add(1)
			}
			// Caught up means holding every event published until
			// now, while it was away: those come by replay.
			r.behindUntil = max(r.behindUntil, uint64(r.sent.Load()))
			r.caughtUp(c.v.last, now.UnixNano())
			return rest, nil
		}
		switch {
		case stop.Err() != nil:
			return nil, stop.Err()
		case errors.Is(err, ErrRejected) || errors.Is(err, ErrProtocol):
			return nil, fmt.Errorf("rejoin node B: resume from %s: %w", r.cursor, err)
		case errors.Is(err, ErrUpgradeRefused):
			s.refusals++
		default:
			s.failures++
		}
		if s.firstFailure == "" {
			s.firstFailure = err.Error()
		}
	}
}

// open dials node B and subscribes sub, as fanwire.js does: the dial and
// the gateway's "ready" get Config.Timeout (its connectTimeout), the
// subscription as long as it takes: a resume's "subscribed" comes once its
// replay has reached the live feed, which in a storm can take a while.
// On failure the connection is closed.
func (s *stormClient) open(stop context.Context, sub subscription) (wireConn, []byte, error) {
	ctx, cancel := context.WithTimeout(stop, s.node.Timeout)
	nc, err := dialWS(ctx, s.node)
	if err == nil {
		if err = awaitReady(ctx, nc); err != nil {
			_ = nc.CloseNow()
		}
	}
	cancel()
	if err != nil {
		return nil, nil, err
	}
	_, rest, err := subscribeAll(stop, nc, sub)
	if err != nil {
		_ = nc.CloseNow()
		return nil, nil, err
	}
	return &nativeConn{Conn: nc}, rest, nil
}
