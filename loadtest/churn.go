package loadtest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
)

// A churn run (Config.Churn) keeps Config.Clients connected and verified
// as usual while Config.ChurnClients churners connect, subscribe, receive
// for a short while and leave, over and over. A churner's session lasts a
// random number of events, up to half a second's worth at Config.Rate:
// event counts rather than wall-clock moments, so one goroutine reads and
// acts, and no timer has to be owned. A session's stream is verified from
// its first event on (it joins mid-stream): strictly consecutive, no
// repeat. What the gateway does with the goroutines and memory of all
// those connections is soak.go's business.

// sessionKind is what one churn session does.
type sessionKind uint8

const (
	sessionClean sessionKind = iota // subscribe, receive, close with a close handshake
	sessionDrop                     // subscribe, receive, close the TCP connection without a handshake
	sessionResub                    // native only: subscribe, receive, then 1–3 times subscribe again under a new id and unsubscribe the old one, receiving between; then close
	sessionEarly                    // connect and drop at once: native after "ready", GraphQL after the upgrade, before connection_init
	numSessionKinds
)

var sessionKindNames = [numSessionKinds]string{"clean close", "drop", "resubscribing", "early drop"}

// churnTally is what one churner did. It is owned by the churner's
// goroutine; the soak reads it after that goroutine has exited.
type churnTally struct {
	sessions     [numSessionKinds]int64 // sessions that connected (and subscribed, but early ones), by kind
	resubscribes int64                  // subscription hand-overs within a resubscribing session
	delivered    int64
	gaps         int64                  // events skipped within a session's stream
	dups         int64                  // events at or below the last one of the session's stream (repeats or out of order)
	misrouted    int64                  // events listing a subscription before its "subscribed" or after its "unsubscribed"
	late         int64                  // sessions whose first event came after one published once they were subscribed
	violation    string                 // the first violation, described
	violating    [numSessionKinds]int64 // sessions with a violation, by kind
	errors       int64                  // sessions that failed: a connect, subscribe or read error, or a server error message
	firstError   string
}

// churner is one churning client: sessions one after another until the
// churn window ends.
type churner struct {
	id       int           // static
	cfg      *Config       // static
	connects *atomic.Int64 // the soak's: sessions connected so far, for progress
	sent     *atomic.Int64 // static once run starts: events the publisher has handed to the broker so far

	rng *rand.Rand // owned by run
	t   churnTally // owned by run
}

// churnErrorPause keeps a churner whose connects fail from spinning.
const churnErrorPause = 100 * time.Millisecond

// errChurnOver: the churn window ended during a session; not a failure.
var errChurnOver = errors.New("churn window over")

// run loops over sessions until churn ends. ctx is the caller's: when it
// ends, connections are cut without a close handshake.
func (ch *churner) run(ctx, churn context.Context) {
	for !windowOver(churn) {
		err := ch.session(ctx, churn, ch.pickKind())
		if err == nil || errors.Is(err, errChurnOver) || windowOver(churn) {
			continue
		}
		ch.t.errors++
		if ch.t.firstError == "" {
			ch.t.firstError = fmt.Sprintf("churner %d: %v", ch.id, err)
		}
		select {
		case <-churn.Done():
		case <-time.After(churnErrorPause):
		}
	}
}

// windowOver reports whether the churn window has ended. Past its
// deadline counts before the context says so: a dial bounded by it fails
// with an i/o timeout from the socket's deadline, which can fire before
// the context's own timer has cancelled it.
func windowOver(churn context.Context) bool {
	if churn.Err() != nil {
		return true
	}
	dl, ok := churn.Deadline()
	return ok && !time.Now().Before(dl)
}

// pickKind draws a session kind: 35% clean closes, 35% drops, 20%
// resubscribing sessions (clean closes with GraphQL), 10% early drops.
func (ch *churner) pickKind() sessionKind {
	switch r := ch.rng.IntN(100); {
	case r < 35:
		return sessionClean
	case r < 70:
		return sessionDrop
	case r < 90:
		if ch.cfg.Proto == ProtoGraphQL {
			return sessionClean
		}
		return sessionResub
	default:
		return sessionEarly
	}
}

// length draws how many events a session receives before its next step:
// 0 up to half a second's worth.
func (ch *churner) length() int64 {
	return ch.rng.Int64N(int64(ch.cfg.Rate)/2 + 1)
}

// session runs one session of kind.
func (ch *churner) session(ctx, churn context.Context, kind sessionKind) error {
	dctx, cancel := context.WithTimeout(churn, ch.cfg.Timeout)
	defer cancel()
	if kind == sessionEarly {
		conn, err := openEarly(dctx, ch.cfg)
		if err != nil {
			return fmt.Errorf("connect: %w", err)
		}
		ch.counted(kind)
		_ = conn.CloseNow()
		return nil
	}
	conn, _, rest, err := open(dctx, ch.cfg, "")
	if err != nil {
		return fmt.Errorf("connect and subscribe: %w", err)
	}
	ch.counted(kind)
	// Every event the publisher hands over from the next but one on was
	// published after the subscribe reply (GraphQL: the pong behind the
	// subscribe) had arrived, so the gateway must deliver it: the first
	// event may come no later.
	s := &churnSession{ch: ch, kind: kind, conn: conn, sub: subID, due: uint64(ch.sent.Load()) + 2}
	if nc, ok := conn.(*nativeConn); ok {
		s.nc = nc.Conn
	}
	unwatch := closeOnDone(ctx, churn, conn)
	err = s.run(churn, rest)
	unwatch()
	if windowOver(churn) { // the watcher has closed it, or the close raced with ours
		_ = conn.CloseNow()
		return errChurnOver
	}
	if err != nil {
		_ = conn.CloseNow()
		return err
	}
	if kind == sessionDrop {
		_ = conn.CloseNow() // no close frame: the gateway finds out from the socket
		return nil
	}
	conn.CloseNormal(churn)
	return nil
}

func (ch *churner) counted(kind sessionKind) {
	ch.t.sessions[kind]++
	ch.connects.Add(1)
}

// openEarly connects without subscribing: a native connection up to its
// "ready", a GraphQL one up to the upgrade.
func openEarly(ctx context.Context, cfg *Config) (wireConn, error) {
	if cfg.Proto == ProtoGraphQL {
		gc, err := dialGraphQL(ctx, cfg)
		if err != nil {
			return nil, err // not a nil *wsConn in a non-nil wireConn
		}
		return gc, nil
	}
	nc, err := dialWS(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if _, err := await(ctx, nc, func(m *controlMsg) bool { return m.Type == "ready" }); err != nil {
		_ = nc.CloseNow()
		return nil, fmt.Errorf("await ready: %w", err)
	}
	return &nativeConn{Conn: nc}, nil
}

// churnSession is one connection of a churner, owned by its goroutine.
type churnSession struct {
	ch   *churner
	kind sessionKind
	conn wireConn
	nc   *websocket.Conn // the native connection, for subscribe and unsubscribe; nil with GraphQL

	due    uint64 // the latest sequence number the first event may have
	last   uint64 // the stream's last sequence number; 0 before its first event
	events int64  // events received in this session

	sub     string // the subscription events must list
	pending string // a subscription sent, not yet confirmed by "subscribed"
	leaving string // an unsubscribe sent, not yet confirmed by "unsubscribed"
	gone    string // an unsubscribed id: no later event may list it

	violated bool // a violation has been counted for this session
}

// run receives, and for a resubscribing session hands the subscription
// over, until the session's planned end. rest is what followed the
// subscribe reply in its frame.
func (s *churnSession) run(churn context.Context, rest []byte) error {
	if err := s.handleFrame(rest); err != nil {
		return err
	}
	if s.kind == sessionResub {
		for hop := range 1 + s.ch.rng.IntN(3) {
			if err := s.receive(s.events + s.ch.length()); err != nil {
				return err
			}
			if err := s.resubscribe(churn, fmt.Sprintf("r%d", hop+2)); err != nil {
				return err
			}
		}
	}
	return s.receive(s.events + s.ch.length())
}

// receive reads whole frames until the session holds n events.
func (s *churnSession) receive(n int64) error {
	return s.readUntil(func() bool { return s.events >= n })
}

// readUntil reads whole frames until done reports true after one.
func (s *churnSession) readUntil(done func() bool) error {
	for !done() {
		frame, _, err := s.conn.ReadMessage()
		if err != nil {
			return fmt.Errorf("read after %d events: %w", s.events, err)
		}
		if err := s.handleFrame(frame); err != nil {
			return err
		}
	}
	return nil
}

// resubscribe hands the stream over to a new subscription on the same
// connection: subscribe id, await "subscribed", unsubscribe the old one,
// await "unsubscribed". The subscriptions overlap, so the stream must go
// on without a gap or a repeat (one delivery per event per connection).
func (s *churnSession) resubscribe(churn context.Context, id string) error {
	s.pending = id
	if err := s.write(churn, map[string]string{"type": "subscribe", "id": id, "subject": s.ch.cfg.Subject}); err != nil {
		return fmt.Errorf("subscribe %s: %w", id, err)
	}
	if err := s.readUntil(func() bool { return s.pending == "" }); err != nil {
		return fmt.Errorf("await subscribed %s: %w", id, err)
	}
	old := s.sub
	s.sub, s.leaving = id, old
	if err := s.write(churn, map[string]string{"type": "unsubscribe", "id": old}); err != nil {
		return fmt.Errorf("unsubscribe %s: %w", old, err)
	}
	if err := s.readUntil(func() bool { return s.leaving == "" }); err != nil {
		return fmt.Errorf("await unsubscribed %s: %w", old, err)
	}
	s.ch.t.resubscribes++
	return nil
}

func (s *churnSession) write(churn context.Context, msg map[string]string) error {
	b, err := json.Marshal(msg)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(churn, s.ch.cfg.Timeout)
	defer cancel()
	return s.nc.Write(ctx, websocket.MessageText, b)
}

// handleFrame verifies the events of one frame and follows the replies
// a resubscribing session waits for.
func (s *churnSession) handleFrame(frame []byte) error {
	for len(frame) > 0 {
		var msg []byte
		var kind msgKind
		var seq uint64
		msg, frame, kind, seq, _ = splitFrame(frame, s.nc == nil)
		switch kind {
		case kindEvent:
			s.observe(seq, msg)
		case kindError:
			return fmt.Errorf("%w: %.200s", ErrRejected, msg)
		case kindMalformed:
			return fmt.Errorf("%w: malformed message %.200q", ErrProtocol, msg)
		case kindOther:
			if s.pending != "" || s.leaving != "" {
				s.reply(msg)
			}
		}
	}
	return nil
}

// reply follows a "subscribed" or "unsubscribed" reply.
func (s *churnSession) reply(msg []byte) {
	var m controlMsg
	if len(bytes.TrimSpace(msg)) == 0 || json.Unmarshal(msg, &m) != nil {
		return
	}
	switch {
	case m.Type == "subscribed" && m.ID == s.pending:
		s.pending = ""
	case m.Type == "unsubscribed" && m.ID == s.leaving:
		s.gone, s.leaving = s.leaving, ""
	}
}

// observe checks one event against the session's stream and, in a
// resubscribing session, against the subscriptions it may list.
func (s *churnSession) observe(seq uint64, msg []byte) {
	t := &s.ch.t
	t.delivered++
	s.events++
	switch {
	case s.last == 0:
		if seq > s.due {
			t.late++
			s.violate("first event seq %d: seq %d was published after the subscribe reply had arrived", seq, s.due)
		}
		s.last = seq
	case seq == s.last+1:
		s.last = seq
	case seq <= s.last:
		t.dups++
		s.violate("seq %d after %d", seq, s.last)
	default:
		t.gaps += int64(seq - s.last - 1)
		s.violate("seq %d after %d: %d missing", seq, s.last, seq-s.last-1)
		s.last = seq
	}
	if s.kind != sessionResub {
		return
	}
	if s.pending != "" && listsSub(msg, s.pending) {
		t.misrouted++
		s.violate("seq %d lists %s before its subscribed reply", seq, s.pending)
	}
	if s.gone != "" && listsSub(msg, s.gone) {
		t.misrouted++
		s.violate("seq %d lists %s after its unsubscribed reply", seq, s.gone)
	}
}

func (s *churnSession) violate(format string, args ...any) {
	if !s.violated {
		s.violated = true
		s.ch.t.violating[s.kind]++
	}
	if s.ch.t.violation == "" {
		s.ch.t.violation = fmt.Sprintf("churner %d, session %d (%s): ", s.ch.id, s.ch.sessionCount(), sessionKindNames[s.kind]) +
			fmt.Sprintf(format, args...)
	}
}

func (ch *churner) sessionCount() int64 {
	var n int64
	for _, k := range ch.t.sessions {
		n += k
	}
	return n
}

var keySubs = []byte(`"subs":[`)

// listsSub reports whether a native event's "subs" list holds id.
func listsSub(msg []byte, id string) bool {
	i := indexKey(msg, keySubs)
	if i < 0 {
		return false
	}
	list := msg[i+len(keySubs):]
	if end := bytes.IndexByte(list, ']'); end >= 0 {
		list = list[:end]
	}
	for item := range bytes.SplitSeq(list, []byte{','}) {
		item = bytes.TrimSpace(item)
		if len(item) == len(id)+2 && item[0] == '"' && string(item[1:len(item)-1]) == id {
			return true
		}
	}
	return false
}
