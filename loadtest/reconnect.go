package loadtest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync/atomic"
	"time"
)

// A run with Config.ResumeShare makes some clients drop their connection
// while events flow and resume on a new one from the cursor of the last
// event they processed. The verifier is the same as every other client's:
// a resumed client must still get every event exactly once and in order,
// so any gap or duplicate at a hand-over between replay and live feed
// shows up in the result.
//
// Drop points are counts of received events, drawn from Config.ResumeSeed,
// not wall-clock moments: a seed then reproduces which clients drop and
// after which event, whatever the machine's speed, and every drop happens
// while that client still has events to receive.

// reconnector is one resuming client's plan and tallies. It is owned by the
// client's reader goroutine; Run reads it after the reader has exited.
type reconnector struct {
	cfg  *Config       // static
	sent *atomic.Int64 // events the publisher has handed to the broker so far; written by the publisher

	points []int64 // received-event counts after which to drop, ascending; consumed from the front
	cursor string  // where the next resume starts: the subscribed reply's cursor, then the last event's at each drop

	reconnects    int
	reconnectTime time.Duration // summed: drop → "subscribed" on the new connection (GraphQL: subscribe sent, as it has no reply)
	catchUpTime   time.Duration // summed: drop → holding every event published before it (and resubscribed)
	behindSince   int64         // unix ns of the drop that made the client fall behind; 0 when caught up
	behindUntil   uint64        // the sequence number that catches it up

	st *stormClient // a reconnect storm's client (Config.StormURL); nil otherwise
}

// planDrops picks round(ResumeShare × Clients) clients and, for each,
// ResumeDrops distinct drop points in [0, Events): the client drops right
// after receiving that many events (0: before the first). It returns one
// entry per client, nil for clients that do not drop. The same Config gives
// the same plan.
func planDrops(cfg *Config) [][]int64 {
	n := cfg.resumingClients()
	if n == 0 {
		return nil
	}
	rng := rand.New(rand.NewPCG(cfg.ResumeSeed, 0))
	plan := make([][]int64, cfg.Clients)
	for _, i := range rng.Perm(cfg.Clients)[:n] {
		// Floyd's sampling: ResumeDrops distinct values in O(ResumeDrops),
		// however close ResumeDrops is to Events.
		events, drops := int64(cfg.Events), int64(cfg.ResumeDrops)
		seen := make(map[int64]bool, drops)
		points := make([]int64, 0, drops)
		for j := events - drops; j < events; j++ {
			k := rng.Int64N(j + 1)
			if seen[k] {
				k = j
			}
			seen[k] = true
			points = append(points, k)
		}
		slices.Sort(points)
		plan[i] = points
	}
	return plan
}

// due reports whether the client drops now, having received delivered
// events, and if so consumes that drop point.
func (r *reconnector) due(delivered int64) bool {
	if len(r.points) == 0 || r.points[0] != delivered {
		return false
	}
	r.points = r.points[1:]
	return true
}

// caughtUp ends the current catch-up once the client holds sequence number
// behindUntil. now is unix ns.
func (r *reconnector) caughtUp(last uint64, now int64) {
	if r.behindSince != 0 && last >= r.behindUntil {
		r.catchUpTime += time.Duration(now - r.behindSince)
		r.behindSince = 0
		if r.st != nil {
			r.st.caughtUp(now)
		}
	}
}

// reconnect drops c's connection without a close handshake, as a client
// that loses its network would, dials again at once and subscribes from
// the cursor. It returns the messages that followed "subscribed" in its
// frame. The dial and handshake get cfg.Timeout and end with stop.
func (c *client) reconnect(stop context.Context) ([]byte, error) {
	r := c.rc
	if r.cursor == "" {
		return nil, fmt.Errorf("%w: no cursor to resume from (the events carry none)", ErrNotDurable)
	}
	dropped := time.Now()
	_ = c.conn.CloseNow()
	if r.behindSince == 0 {
		r.behindSince = dropped.UnixNano()
	}
	r.behindUntil = max(r.behindUntil, uint64(r.sent.Load()))

	ctx, cancel := context.WithTimeout(stop, r.cfg.Timeout)
	defer cancel()
	conn, _, rest, err := open(ctx, r.cfg, r.cursor)
	if err != nil {
		return nil, fmt.Errorf("reconnect %d: resume from %s: %w", r.reconnects+1, r.cursor, err)
	}
	c.conn = conn
	now := time.Now()
	r.reconnects++
	r.reconnectTime += now.Sub(dropped)
	// A client that already held everything published before the drop is
	// caught up as soon as it is subscribed again.
	r.caughtUp(c.v.last, now.UnixNano())
	return rest, nil
}

// checkDurable makes sure, before any client connects, that the gateway
// can resume subscriptions on cfg.Subject, and that every client will
// subscribe after a known cursor. It publishes a primer event and gets its
// cursor from the broker (a subject no JetStream stream stores fails
// here), then subscribes once from that cursor: the gateway answers
// "subscribed" only when its live feed has passed the primer (and a
// gateway without history answers bad_cursor). So the clients never see
// the primer, and each one's "subscribed" reply carries a cursor.
//
// It returns the primer's cursor. The check speaks the native protocol
// (at cfg.URL) whatever cfg.Proto: only its "subscribed" reply tells when
// the live feed has passed the primer.
func checkDurable(ctx context.Context, cfg *Config, out sink) (string, error) {
	actx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	cursor, err := out.sendAcked(actx, cfg.Subject, []byte(`{"primer":true}`))
	if err != nil {
		return "", fmt.Errorf("resume: publish primer: %w", err)
	}
	if _, err := subscribeOnce(ctx, cfg, cursor); err != nil {
		return "", fmt.Errorf("resume: subscribe from the primer's cursor %s: %w", cursor, err)
	}
	return cursor, nil
}

// ResumeStats is what the resuming clients of a run (Config.ResumeShare)
// did. Their deliveries are verified and counted with everyone's in Result.
type ResumeStats struct {
	Clients    int    // clients that dropped and resumed
	Drops      int    // planned drops per client
	Seed       uint64 // Config.ResumeSeed: rerun with it to drop the same clients after the same events
	Reconnects int    // reconnections that subscribed again
	// ReconnectTime sums, over reconnects, the time from dropping to the
	// "subscribed" reply on the new connection (with Proto graphql, which
	// has no such reply: to the resuming subscribe being sent).
	ReconnectTime time.Duration
	// CatchUpTime sums the time resuming clients spent behind: from a drop
	// until they were subscribed again and held every event published
	// before it (overlapping drops count once).
	CatchUpTime time.Duration
}

// collectResume sums the reconnectors' tallies; nil when no client resumed.
func collectResume(cfg *Config, clients []*client) *ResumeStats {
	if cfg.resumingClients() == 0 {
		return nil
	}
	r := &ResumeStats{Clients: cfg.resumingClients(), Drops: cfg.ResumeDrops, Seed: cfg.ResumeSeed}
	for _, c := range clients {
		if c.rc == nil {
			continue
		}
		r.Reconnects += c.rc.reconnects
		r.ReconnectTime += c.rc.reconnectTime
		r.CatchUpTime += c.rc.catchUpTime
	}
	return r
}
