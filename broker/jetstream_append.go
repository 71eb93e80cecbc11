package broker

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
)

// Append stores msgs in order, with their ids as Nats-Msg-Id, and returns
// when every one is stored (see Appender). It keeps Publish's guarantees
// (the stream holds a prefix of the publish order at every moment, a
// resend is recognized by its ids) without its price: no cursors, so no
// answer per message nor per window (docs/benchmarks.md, "JetStream
// append: fast batches"; how: docs/architecture.md, "JetStream: Append").
//
// A message the stream refuses fails Append with its error; nothing after
// it is stored. A lost connection, an answer that does not come within
// publishAckTimeout, a stream without a leader or with too many batches
// in flight: the messages not yet known to be stored are sent again, at
// growing intervals, until ctx is done; their ids make that safe. A batch
// holding a message without an id whose fate is unknown is not sent
// again: Append returns an error, as Publish does. On a stream without
// fast batches (an older server, or one re-created without
// allow_batched), Append is Publish.
//
// The writer (opts.Writer) is in each message's id, which is all LastID
// reads; opts.Check is not checked: a JetStream stream can check the last
// sequence on one subject filter only, and the writers sharing a stream
// and a prefix publish on subjects no single filter separates.
//
// Before it sends again what was not acknowledged, it asks opts.Fence (a
// writer that lost its lease while it waited sends nothing more).
func (b *JetStream) Append(ctx context.Context, msgs []Outgoing, opts AppendOptions) error {
	if err := CheckWriter(opts.Writer); err != nil {
		return fmt.Errorf("jetstream append: %w", err)
	}
	// msgs go as one fast batch; what the server stores of it, and what
	// goes again how: docs/architecture.md, "JetStream: Append".
	wait := publishRetryMin
	for attempt, sent := 0, false; len(msgs) > 0; sent = true {
		if sent && opts.Fence != nil {
			if err := opts.Fence(ctx); err != nil {
				return fmt.Errorf("jetstream append: %d messages not sent again: %w", len(msgs), err)
			}
		}
		if !b.fast.Load() {
			_, err := b.Publish(ctx, msgs)
			return err
		}
		r := b.appendBatch(ctx, msgs, "")
		msgs = msgs[r.stored:]
		switch r.next {
		case fastDone:
			return nil
		case fastFailed:
			return fmt.Errorf("jetstream append: %w", r.err)
		case fastSwitched:
			continue // to Publish
		case fastEach:
			n, again, err := b.publishKnown(ctx, msgs)
			msgs = msgs[n:]
			if err != nil {
				return err
			}
			if !again {
				wait, attempt = publishRetryMin, 0
				continue
			}
			r.why = "a message not acknowledged"
		case fastAgain:
			if r.stored > 0 {
				wait, attempt = publishRetryMin, 0 // progress: the next wait starts short
			}
		}
		if attempt == 0 {
			b.core.log.Warn("jetstream append not acknowledged (failover?); sending again", zap.Int("messages", len(msgs)), zap.String("reason", r.why))
		}
		attempt++
		var err error
		if wait, err = publishBackoff(ctx, wait); err != nil {
			return fmt.Errorf("jetstream append: %d messages not acknowledged: %w", len(msgs), err)
		}
	}
	return nil
}

// fastNext says what Append does after a batch.
type fastNext int

const (
	fastDone     fastNext = iota // every message is stored
	fastFailed                   // for good: return err
	fastEach                     // a message is stored already, or was refused: see publishKnown
	fastSwitched                 // the stream takes no fast batches: the rest goes through Publish
	fastAgain                    // not acknowledged: send the rest again, later
)

// fastResult is the outcome of appendBatch: the first stored messages are
// stored, and next says what to do with the rest.
type fastResult struct {
	stored int
	next   fastNext
	err    error
	why    string // for fastAgain, what happened
	// last is the stream sequence of the last stored message, when the
	// server's final answer said it (0: unknown).
	last uint64
}

// appendBatch sends msgs as one fast batch and waits for its end. With a
// tag, each message carries it in pubTagHeader, followed by its place in
// msgs ("<tag>.1" for the first): Publish finds its messages by it.
func (b *JetStream) appendBatch(ctx context.Context, msgs []Outgoing, tag string) fastResult {
	nc := b.core.nc
	c := &fastCall{flow: make(chan struct{}, 1), end: make(chan fastAnswer, 1)}
	id := rand.Text() // 26 characters; the server takes up to 64
	b.fastMu.Lock()
	b.fastCalls[id] = c
	b.fastMu.Unlock()
	defer func() {
		b.fastMu.Lock()
		delete(b.fastCalls, id)
		b.fastMu.Unlock()
	}()
	lost := nc.StatusChanged(nats.RECONNECTING, nats.CLOSED)
	defer nc.RemoveStatusListener(lost)
	idle := time.NewTimer(publishAckTimeout)
	defer idle.Stop()

	// A lost or unknown outcome: what the flow acks say is stored is, and
	// the rest may be sent again if their ids make that safe.
	unknown := func(why string, err error) fastResult {
		stored := min(int(c.acked.Load()), len(msgs))
		if slices.ContainsFunc(msgs[stored:], func(m Outgoing) bool { return m.ID == "" }) {
			return fastResult{stored: stored, next: fastFailed, err: fmt.Errorf("%s, and messages without ids may be stored: not sending them again: %w", why, err)}
		}
		return fastResult{stored: stored, next: fastAgain, why: why}
	}

	// One message, header and reply subject for the whole batch: PublishMsg
	// copies them into the connection's buffer before it returns, and keeps
	// none of them.
	reply := make([]byte, 0, len(b.fastInbox)+len(id)+48)
	reply = fmt.Appendf(reply, "%s.%s.%d.%s.", b.fastInbox, id, fastFlow, "fail")
	prefix := len(reply)
	hdr := nats.Header{jetstream.MsgIDHeader: []string{""}}
	var tagged nats.Header
	var tagBuf []byte
	tagLen := len(tag) + 1
	if tag != "" {
		tagged = nats.Header{pubTagHeader: []string{""}}
		tagBuf = append(make([]byte, 0, tagLen+8), tag...)
		tagBuf = append(tagBuf, '.')
	}
	msg := &nats.Msg{}
	last := len(msgs) - 1
	for i, m := range msgs {
		op := fastOpAppend
		switch {
		case i == last:
			op = fastOpCommit
		case i == 0:
			op = fastOpStart
		}
		reply = strconv.AppendUint(reply[:prefix], uint64(i+1), 10)
		reply = append(reply, '.', byte('0'+op))
		reply = append(reply, fastSuffix...)
		msg.Subject, msg.Data = m.Subject, m.Data
		// The string shares reply's bytes, which change only after
		// PublishMsg returned.
		msg.Reply = unsafe.String(unsafe.SliceData(reply), len(reply))
		msg.Header = nil
		switch {
		case tag != "":
			// Publish tags messages without ids only. The string shares
			// tagBuf's bytes, which change only after PublishMsg returned.
			tagBuf = strconv.AppendUint(tagBuf[:tagLen], uint64(i+1), 10)
			tagged[pubTagHeader][0] = unsafe.String(unsafe.SliceData(tagBuf), len(tagBuf))
			msg.Header = tagged
		case m.ID != "":
			hdr[jetstream.MsgIDHeader][0] = m.ID
			msg.Header = hdr
		}
		err := nc.PublishMsg(msg)
		msg.Reply = ""
		if i == 0 && tag != "" && b.pubHooks.afterFirst != nil && err == nil {
			if err = nc.Flush(); err == nil {
				b.pubHooks.afterFirst()
			}
		}
		if err != nil {
			switch {
			case errors.Is(err, nats.ErrConnectionClosed):
				return fastResult{next: fastFailed, err: fmt.Errorf("%q: %w", m.Subject, err)}
			case errors.Is(err, nats.ErrReconnectBufExceeded) && i == 0:
				// The connection is down and keeps nothing for later
				// (DialJetStream): no message of the batch was sent.
				return fastResult{next: fastAgain, why: "the connection is down"}
			case errors.Is(err, nats.ErrMaxPayload), errors.Is(err, nats.ErrBadSubject):
				// This message can never go: end the batch before it, and
				// once the server says how far it got, fail.
				return b.endBefore(ctx, c, id, i, m, err, lost, idle, unknown)
			}
			return unknown("publish failed", err)
		}
		// Stop at the first final answer (a refused first message); and
		// keep at most fastAhead messages beyond what the server says it
		// stored.
		for {
			select {
			case a := <-c.end:
				return b.batchEnded(a, c.acked.Load(), msgs, unknown)
			default:
			}
			if uint64(i+1)-c.acked.Load() < fastAhead {
				break
			}
			a, fail := waitAnswer(ctx, c, len(msgs), lost, idle, unknown, "no flow ack")
			if fail != nil {
				return *fail
			}
			if a != nil {
				return b.batchEnded(*a, c.acked.Load(), msgs, unknown)
			}
		}
	}
	return b.waitEnd(ctx, c, len(msgs), msgs, lost, idle, unknown)
}

// endBefore ends the batch before msgs[i], which cannot be sent, and
// returns err once the server said how many messages it stored.
func (b *JetStream) endBefore(ctx context.Context, c *fastCall, id string, i int, m Outgoing, err error, lost <-chan nats.Status, idle *time.Timer, unknown func(string, error) fastResult) fastResult {
	failed := fastResult{stored: i, next: fastFailed, err: fmt.Errorf("%q: %w", m.Subject, err)}
	if i == 0 {
		return failed // no batch yet
	}
	eob := &nats.Msg{Subject: m.Subject, Reply: fmt.Sprintf("%s.%s.%d.%s.%d.%d%s", b.fastInbox, id, fastFlow, "fail", i+1, fastOpCommitEOB, fastSuffix)}
	if perr := b.core.nc.PublishMsg(eob); perr != nil {
		return unknown("publish failed", perr)
	}
	r := b.waitEnd(ctx, c, i, nil, lost, idle, unknown)
	if r.next == fastDone {
		return failed
	}
	return r
}

// waitEnd waits for the end of a batch of n messages (msgs, or nil when
// the batch was ended early).
func (b *JetStream) waitEnd(ctx context.Context, c *fastCall, n int, msgs []Outgoing, lost <-chan nats.Status, idle *time.Timer, unknown func(string, error) fastResult) fastResult {
	for {
		a, fail := waitAnswer(ctx, c, n, lost, idle, unknown, "no answer")
		switch {
		case fail != nil:
			return *fail
		case a == nil: // a flow ack: wait on
		case msgs != nil:
			return b.batchEnded(*a, c.acked.Load(), msgs, unknown)
		case a.ack.Error == nil && a.ack.Batch != "" && a.ack.Count == n:
			return fastResult{stored: n, next: fastDone, last: a.ack.Seq}
		default:
			return fastResult{stored: min(int(c.acked.Load()), n), next: fastEach}
		}
	}
}

// waitAnswer waits for the next answer to a batch of n messages: its end
// (a), a flow ack (neither a nor fail), or what makes its outcome unknown
// or ends the wait (fail: the connection lost, nothing from the server
// for publishAckTimeout, which silent names, or ctx done).
func waitAnswer(ctx context.Context, c *fastCall, n int, lost <-chan nats.Status, idle *time.Timer, unknown func(string, error) fastResult, silent string) (a *fastAnswer, fail *fastResult) {
	var r fastResult
	select {
	case end := <-c.end:
		return &end, nil
	case <-c.flow:
		idle.Reset(publishAckTimeout)
		return nil, nil
	case <-lost:
		r = unknown("connection lost", nats.ErrDisconnected)
	case <-idle.C:
		r = unknown(silent, jetstream.ErrAsyncPublishTimeout)
	case <-ctx.Done():
		r = fastResult{stored: min(int(c.acked.Load()), n), next: fastFailed, err: fmt.Errorf("waiting for the server: %w", ctx.Err())}
	}
	return nil, &r
}

// batchEnded interprets the final answer to a batch of msgs, acked of
// which the flow acks said were stored.
func (b *JetStream) batchEnded(a fastAnswer, acked uint64, msgs []Outgoing, unknown func(string, error) fastResult) fastResult {
	if a.noResponders {
		if a.place == 1 {
			return fastResult{next: fastAgain, why: "no responders"} // no stream, or no leader: nothing stored
		}
		// The stream went away after the batch's first messages (a server
		// stops JetStream before it closes its connections): those may be
		// stored, and were sent again as if none were, which stored them
		// twice (TestJetStreamPublishNoRespondersMidBatch).
		return unknown("no responders after the batch's start", nats.ErrNoResponders)
	}
	ack := a.ack
	switch {
	case ack.Error == nil && ack.Duplicate:
		// The first message is stored already; the server dropped the
		// batch (the others were refused as of an unknown batch).
		return fastResult{stored: 1, next: fastEach, last: ack.Seq}
	case ack.Error == nil && ack.Batch != "":
		if ack.Count >= len(msgs) {
			return fastResult{stored: len(msgs), next: fastDone, last: ack.Seq}
		}
		// A message was refused, or went missing: the batch ended before
		// it, and the rest goes one at a time until it is past it.
		return fastResult{stored: ack.Count, next: fastEach, last: ack.Seq}
	case ack.Error == nil:
		return fastResult{next: fastFailed, err: fmt.Errorf("unexpected answer %+v", ack)}
	}
	e := ack.Error
	switch {
	case e.ErrorCode == errCodeFastBatchDisabled:
		if b.fast.Swap(false) {
			b.core.log.Warn("jetstream: the stream refuses fast batches (re-created without allow_batched?): publishing atomic batches", zap.String("stream", b.cfg.Stream))
		}
		return fastResult{next: fastSwitched} // the batch did not start
	case e.ErrorCode == errCodeFastBatchTooManyInflight, e.Code == 503:
		return fastResult{next: fastAgain, why: e.Description} // the batch did not start: nothing stored
	case e.ErrorCode == errCodeFastBatchUnknown:
		// The batch was gone before this message: timed out on the server
		// (its cleanup timer), or lost with a leader.
		return unknown("batch dropped by the server", e)
	}
	// A message was refused before the batch was in the server's hands
	// (its size, a limit) or as the batch's first: the batch ends before it
	// (the next message is a gap), or never started. Which message is
	// unknown: the rest, from what the flow acks say is stored, goes one at
	// a time until it is past it.
	return fastResult{stored: min(int(acked), len(msgs)), next: fastEach}
}

// publishKnown publishes msgs one at a time, each after the one before is
// stored, until one is stored anew (not a repeat): it returns how many it
// stored (that one included). It returns the error of a message the stream
// refuses, and reports again when a message was not acknowledged and may
// be sent again.
func (b *JetStream) publishKnown(ctx context.Context, msgs []Outgoing) (n int, again bool, err error) {
	for i, m := range msgs {
		ack, again, err := b.publishOne(ctx, m, "append")
		if err != nil || again {
			return i, again, err
		}
		if !ack.Duplicate {
			return i + 1, false, nil
		}
	}
	return len(msgs), false, nil
}

// fastCall is an appendBatch waiting for the server's answers, which
// fastReply routes to it by batch id.
type fastCall struct {
	acked atomic.Uint64   // the batch sequence up to which the server stored every message
	flow  chan struct{}   // signalled (non-blocking) by each flow ack
	end   chan fastAnswer // the batch's final answer (the first one only)
	ended atomic.Bool
}

// fastAnswer is a batch's final answer.
type fastAnswer struct {
	ack          fastAck
	noResponders bool
	place        int // with noResponders: the batch sequence of the message it answers
}

// fastAck is any of the server's answers to a fast batch: a flow ack
// ("ack": every message up to seq is stored), a gap or an error report
// ("gap", "err": the final answer follows), or the final answer (no type:
// a publish ack or error, with the batch's id and how many of its messages
// the server took).
type fastAck struct {
	Type      string              `json:"type"`
	Seq       uint64              `json:"seq"`
	Batch     string              `json:"batch"`
	Count     int                 `json:"count"`
	Duplicate bool                `json:"duplicate"`
	Error     *jetstream.APIError `json:"error"`
}

// fastReply receives every answer to the fast batches of this connection
// and hands it to the waiting appendBatch.
func (b *JetStream) fastReply(m *nats.Msg) {
	// <inbox>.<batch id>.<flow>.<gap mode>.<batch seq>.<op>.$FI
	s, ok := strings.CutSuffix(m.Subject, fastSuffix)
	var place string // <batch seq>
	for i := range 4 {
		if !ok {
			return
		}
		var field string
		s, field, ok = cutLast(s)
		if i == 1 {
			place = field
		}
	}
	_, id, ok := cutLast(s)
	if !ok {
		return
	}
	b.fastMu.Lock()
	c := b.fastCalls[id]
	b.fastMu.Unlock()
	if c == nil {
		return // a late answer to a batch that ended
	}
	var a fastAnswer
	if len(m.Data) == 0 && m.Header.Get("Status") == "503" {
		a.noResponders = true
		a.place, _ = strconv.Atoi(place)
	} else if err := json.Unmarshal(m.Data, &a.ack); err != nil {
		b.core.log.Warn("jetstream: undecodable fast batch answer", zap.ByteString("data", m.Data), zap.Error(err))
		return
	}
	switch a.ack.Type {
	case "ack":
		for {
			old := c.acked.Load()
			if a.ack.Seq <= old || c.acked.CompareAndSwap(old, a.ack.Seq) {
				break
			}
		}
		select {
		case c.flow <- struct{}{}:
		default:
		}
		return
	case "gap", "err":
		b.core.log.Debug("jetstream: fast batch ends early", zap.ByteString("answer", m.Data))
		return
	}
	if c.ended.CompareAndSwap(false, true) {
		c.end <- a
	}
}

// cutLast cuts s around its last '.'.
func cutLast(s string) (before, after string, ok bool) {
	i := strings.LastIndexByte(s, '.')
	if i < 0 {
		return s, "", false
	}
	return s[:i], s[i+1:], true
}

// The fast batch protocol (reply subjects and error codes).
const (
	fastSuffix      = ".$FI"
	fastOpStart     = 0
	fastOpAppend    = 1
	fastOpCommit    = 2 // this message is the batch's last
	fastOpCommitEOB = 3 // the batch ends before this (message-less) one
	// fastFlow is the flow acks Append asks for: one every fastFlow
	// messages (the server sends them less often, down to one per message,
	// when several batches share the stream).
	fastFlow = 500
	// fastAhead is the most messages Append sends beyond what the server
	// says it stored: the pending limit of an asynchronous publisher.
	fastAhead = 4096

	errCodeFastBatchDisabled        jetstream.ErrorCode = 10205
	errCodeFastBatchUnknown         jetstream.ErrorCode = 10208
	errCodeFastBatchTooManyInflight jetstream.ErrorCode = 10211
)
