package loadtest

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/coder/websocket"
)

// ResumeResult is what Resume measured.
type ResumeResult struct {
	Behind       int           // events published while the client was away
	Received     int           // events received after resuming
	CatchUp      time.Duration // from sending the resuming subscribe to the last event
	EventsPerSec float64       // Received / CatchUp
	Cursor       string        // the cursor the client resumed from
	OK           bool          // every event once, in order
}

// Resume measures catching up: a client subscribes (its "subscribed"
// carries the current cursor) and leaves, behind events are published, and
// the client comes back with that cursor. It must receive all of them, in
// order, once; the catch-up rate is what the replay delivers. The gateway's
// broker must keep history. The cursor is found with the native protocol
// (at cfg.URL); the resuming client speaks cfg.Proto.
func Resume(ctx context.Context, cfg Config, behind int) (*ResumeResult, error) {
	cfg.Events = behind
	if err := cfg.setDefaults(); err != nil {
		return nil, fmt.Errorf("loadtest: %w", err)
	}
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("loadtest: %w", err)
	}
	out, err := openSink(ctx, &cfg)
	if err != nil {
		return nil, fmt.Errorf("loadtest: %w", err)
	}
	defer out.close()
	// A primer event gives the stream a position to report even when it
	// was empty: the live "subscribed" reply carries the cursor of the last
	// event dispatched, none before the first.
	if err := out.send(ctx, cfg.Subject, []byte(`{"primer":true}`)); err != nil {
		return nil, fmt.Errorf("loadtest: publish primer: %w", err)
	}
	if err := out.flush(ctx); err != nil {
		return nil, fmt.Errorf("loadtest: publish primer: %w", err)
	}
	var cursor string
	for try := 0; cursor == "" && try < 50; try++ {
		if try > 0 {
			time.Sleep(20 * time.Millisecond) // the primer is on its way through the broker
		}
		if cursor, err = subscribeOnce(ctx, &cfg, ""); err != nil {
			return nil, fmt.Errorf("loadtest: %w", err)
		}
	}
	if cursor == "" {
		return nil, fmt.Errorf("loadtest: the gateway's subscribed reply has no cursor: its broker keeps no history (run it with --broker jetstream)")
	}
	if err := publish(ctx, out, &cfg, nil); err != nil {
		return nil, fmt.Errorf("loadtest: publish: %w", err)
	}

	dctx, cancel := context.WithTimeout(ctx, cfg.Timeout+time.Duration(behind)*time.Millisecond)
	defer cancel()
	gql := cfg.Proto == ProtoGraphQL
	conn, err := openEarly(dctx, &cfg)
	if err != nil {
		return nil, fmt.Errorf("loadtest: %w", err)
	}
	defer conn.CloseNow()
	var gc *wsConn
	var nc *websocket.Conn
	if gql {
		gc = conn.(*wsConn)
		if err := gqlInit(dctx, gc); err != nil {
			return nil, fmt.Errorf("loadtest: %w", err)
		}
	} else {
		nc = conn.(*nativeConn).Conn
	}
	start := time.Now()
	if gql {
		err = gqlSubscribe(dctx, gc, cfg.Subject, cursor)
	} else {
		err = writeSubscribe(dctx, nc, subscription{subject: cfg.Subject, from: cursor})
	}
	if err != nil {
		return nil, fmt.Errorf("loadtest: resume: %w", err)
	}
	// Reads take no context (wireConn): the connection is closed when dctx ends.
	unwatch := context.AfterFunc(dctx, func() { _ = conn.CloseNow() })
	defer unwatch()
	c := &client{gql: gql, conn: conn, v: newVerifier(behind)}
	for !c.v.complete() {
		msg, at, err := conn.ReadMessage()
		if err != nil {
			if dctx.Err() != nil {
				err = fmt.Errorf("%w (%v)", dctx.Err(), err)
			}
			return nil, fmt.Errorf("loadtest: resume: after %d of %d events: %w", c.v.delivered, behind, err)
		}
		c.handleFrame(msg, at)
		if c.serverErrors > 0 {
			return nil, fmt.Errorf("%w: %s", ErrRejected, c.firstServerError)
		}
	}
	res := &ResumeResult{Behind: behind, Received: int(c.v.delivered), CatchUp: time.Since(start), Cursor: cursor}
	res.EventsPerSec = float64(res.Received) / res.CatchUp.Seconds()
	res.OK = c.v.gaps == 0 && c.v.dups == 0 && c.v.missing() == 0
	if unwatch() {
		conn.CloseNormal(dctx)
	}
	return res, nil
}

// subscribeOnce connects, subscribes (from the cursor from, unless it is
// "") and returns the cursor of the "subscribed" reply, then disconnects.
func subscribeOnce(ctx context.Context, cfg *Config, from string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	conn, err := dialWS(ctx, cfg)
	if err != nil {
		return "", err
	}
	defer conn.CloseNow()
	cursor, _, err := handshake(ctx, conn, subscription{subject: cfg.Subject, from: from})
	if err != nil {
		return "", err
	}
	_ = conn.Close(websocket.StatusNormalClosure, "done")
	return cursor, nil
}

// WriteTable prints the result for people.
func (r *ResumeResult) WriteTable(w io.Writer) {
	fmt.Fprintf(w, "resumed from                %s, %d events behind\n", r.Cursor, r.Behind)
	fmt.Fprintf(w, "received                    %d (in order, once each: %v)\n", r.Received, r.OK)
	fmt.Fprintf(w, "catch-up                    %v (%.0f events/s)\n", r.CatchUp.Round(time.Microsecond), r.EventsPerSec)
}
