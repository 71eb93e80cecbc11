package broker

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
)

// Publish publishes msgs with their ids as Nats-Msg-Id and returns their
// cursors once every one is stored. The stream holds a prefix of the
// publish order at every moment: no message is stored after one that was
// refused or lost. A repeated id (within the stream's duplicate window)
// is not stored again; its cursor is the original's. Publish rides out a
// failover until ctx is done, sending again what was not acknowledged. A
// message without an id whose answer was lost may be stored already:
// Publish returns that error rather than risk storing it twice. How:
// docs/architecture.md, "JetStream: Publish".
func (b *JetStream) Publish(ctx context.Context, msgs []Outgoing) ([]string, error) {
	cursors := make([]string, len(msgs))
	start := 0
	if b.fast.Load() && !slices.ContainsFunc(msgs, func(m Outgoing) bool { return m.ID != "" }) {
		done, err := b.publishFast(ctx, msgs, cursors)
		switch {
		case err != nil:
			return nil, err
		case done:
			return cursors, nil
		}
		// The stream stopped taking fast batches: the rest goes as atomic
		// batches.
		start = slices.Index(cursors, "")
	}
	for start < len(msgs) {
		n := min(len(msgs)-start, int(b.batchMax.Load()))
		err := b.publishWindow(ctx, msgs[start:start+n], cursors[start:start+n])
		if errors.Is(err, errBatchTooLarge) {
			continue // batchMax shrank: send this window again, in smaller ones
		}
		if err != nil {
			return nil, err
		}
		start += n
	}
	return cursors, nil
}

// errBatchTooLarge is returned by publishWindow when the server refused a
// batch as larger than its limit; batchMax has been halved.
var errBatchTooLarge = errors.New("jetstream: atomic batch too large")

// publishWindow stores msgs, in order, and records their cursors, trying
// again until ctx is done or a message fails for good.
func (b *JetStream) publishWindow(ctx context.Context, msgs []Outgoing, cursors []string) error {
	wait := publishRetryMin
	for attempt := 0; ; attempt++ {
		var again bool
		var err error
		if len(msgs) == 1 || !b.atomic.Load() {
			again, err = b.publishEach(ctx, msgs, cursors)
		} else {
			again, err = b.publishBatch(ctx, msgs, cursors)
		}
		if err != nil || !again {
			return err
		}
		if attempt == 0 {
			b.core.log.Warn("jetstream publish not acknowledged (failover?); sending again", zap.Int("messages", len(msgs)))
		}
		if wait, err = publishBackoff(ctx, wait); err != nil {
			return fmt.Errorf("jetstream publish: %d messages not acknowledged: %w", len(msgs), err)
		}
	}
}

// publishBatch sends msgs as one atomic batch and records their cursors.
// It reports again when the batch was not stored and may be sent again
// as it is; it falls back to publishEach when the server refuses the
// batch as a whole for what a message-at-a-time publish can sort out.
func (b *JetStream) publishBatch(ctx context.Context, msgs []Outgoing, cursors []string) (again bool, err error) {
	nc := b.core.nc
	batch := rand.Text() // 26 characters; the server takes up to 64
	last := len(msgs) - 1
	for i, m := range msgs {
		hdr := nats.Header{
			batchIDHeader:  []string{batch},
			batchSeqHeader: []string{strconv.Itoa(i + 1)},
		}
		if m.ID != "" {
			hdr[jetstream.MsgIDHeader] = []string{m.ID}
		}
		msg := &nats.Msg{Subject: m.Subject, Data: m.Data, Header: hdr}
		if i < last {
			// No reply subject: the server answers only the commit.
			if err := nc.PublishMsg(msg); err != nil {
				if errors.Is(err, nats.ErrConnectionClosed) {
					return false, fmt.Errorf("jetstream publish %q: %w", m.Subject, err)
				}
				return true, nil // the server drops the incomplete batch
			}
			continue
		}
		hdr[batchCommitHeader] = []string{"1"}
		resp, err := b.commitBatch(ctx, msg)
		switch {
		case err == nil:
		case ctx.Err() != nil:
			return false, fmt.Errorf("jetstream publish: waiting for the batch's ack: %w", ctx.Err())
		case errors.Is(err, nats.ErrConnectionClosed):
			return false, fmt.Errorf("jetstream publish %q: %w", m.Subject, err)
		case errors.Is(err, nats.ErrNoResponders):
			return true, nil // no stream, or no leader: nothing stored
		case errors.Is(err, nats.ErrReconnectBufExceeded):
			return true, nil // the commit was not sent: the server drops the batch
		case slices.ContainsFunc(msgs, func(m Outgoing) bool { return m.ID == "" }):
			return false, fmt.Errorf("jetstream publish: the answer to a batch with messages without ids was lost, and it may be stored: not sending it again: %w", err)
		default:
			// A lost answer: the batch may have been stored, and if it
			// was, the next one is refused for its known ids and goes one
			// message at a time.
			return true, nil
		}
		var ack batchAck
		if err := json.Unmarshal(resp.Data, &ack); err != nil {
			return false, fmt.Errorf("jetstream publish: batch ack %q: %w", resp.Data, err)
		}
		if ack.Error != nil {
			return b.batchRefused(ctx, ack.Error, msgs, cursors)
		}
		if ack.Count != len(msgs) || ack.Seq < uint64(len(msgs)) {
			return false, fmt.Errorf("jetstream publish: batch of %d acked with count %d at sequence %d", len(msgs), ack.Count, ack.Seq)
		}
		// A batch is stored contiguously: its last message at ack.Seq.
		b.observe(ack.Seq)
		first := ack.Seq - uint64(len(msgs)) + 1
		for i := range cursors {
			cursors[i] = FormatJSCursor(first + uint64(i))
		}
	}
	return false, nil
}

// commitBatch sends a batch's last message and waits for the server's
// answer, at most publishAckTimeout, and no longer than the connection
// lasts: when it drops the answer is lost (as nats.go fails the acks of
// async publishes), and waiting out the timeout would stall the ingest.
func (b *JetStream) commitBatch(ctx context.Context, msg *nats.Msg) (*nats.Msg, error) {
	nc := b.core.nc
	lost := nc.StatusChanged(nats.RECONNECTING, nats.CLOSED)
	defer nc.RemoveStatusListener(lost)
	rctx, cancel := context.WithTimeout(ctx, publishAckTimeout)
	var watch sync.WaitGroup
	watch.Go(func() {
		select {
		case <-lost:
			cancel()
		case <-rctx.Done():
		}
	})
	defer watch.Wait()
	defer cancel()
	return nc.RequestMsgWithContext(rctx, msg)
}

// batchRefused handles a batch the server answered with an error.
func (b *JetStream) batchRefused(ctx context.Context, e *jetstream.APIError, msgs []Outgoing, cursors []string) (again bool, err error) {
	switch e.ErrorCode {
	case errCodeBatchIncomplete, errCodeBatchTooManyInflight:
		return true, nil // a message went missing, or too many batches at once: send it again
	case errCodeBatchTooLarge:
		if n := b.batchMax.Load(); n > 1 {
			b.batchMax.CompareAndSwap(n, max(n/2, 1))
		}
		b.core.log.Warn("jetstream: the server limits atomic batches below our window; halving it", zap.Int32("window", b.batchMax.Load()), zap.String("error", e.Description))
		return false, errBatchTooLarge
	case errCodeBatchDisabled:
		if b.atomic.Swap(false) {
			b.core.log.Warn("jetstream: the stream refuses atomic batches (re-created without allow_atomic?): publishing one message at a time, in order", zap.String("stream", b.cfg.Stream))
		}
	}
	if e.Code == 503 {
		return true, nil
	}
	// A known id (the batch, or part of it, was stored before and its
	// answer lost), a message the stream refuses: one at a time, each
	// message gets its own answer.
	return b.publishEach(ctx, msgs, cursors)
}

// publishEach publishes msgs one at a time, each after the one before is
// stored, skipping those with a cursor already. Nothing of it is in flight
// when it returns. It reports again when a message was not acknowledged
// and may be sent again.
func (b *JetStream) publishEach(ctx context.Context, msgs []Outgoing, cursors []string) (again bool, err error) {
	for i, m := range msgs {
		if cursors[i] != "" {
			continue
		}
		ack, again, err := b.publishOne(ctx, m, "publish")
		if err != nil || again {
			return again, err
		}
		cursors[i] = FormatJSCursor(ack.Sequence)
	}
	return false, nil
}

// publishOne publishes m alone and waits for its ack, at most
// publishAckTimeout. On a failure it reports again when m may be sent
// again (see publishRetryable), or the error; op names the caller in it.
func (b *JetStream) publishOne(ctx context.Context, m Outgoing, op string) (_ *jetstream.PubAck, again bool, _ error) {
	opts := []jetstream.PublishOpt{publishNoRetry}
	if m.ID != "" {
		opts = append(opts, jetstream.WithMsgID(m.ID))
	}
	rctx, cancel := context.WithTimeout(ctx, publishAckTimeout)
	ack, err := b.js.Publish(rctx, m.Subject, m.Data, opts...)
	cancel()
	if err == nil {
		b.observe(ack.Sequence)
		return ack, false, nil
	}
	if ctx.Err() != nil {
		return nil, false, fmt.Errorf("jetstream %s: %w", op, ctx.Err())
	}
	if errors.Is(err, context.DeadlineExceeded) {
		err = jetstream.ErrAsyncPublishTimeout // the ack is lost: retryable with an id
	}
	if !publishRetryable(err, m.ID != "") {
		return nil, false, fmt.Errorf("jetstream %s %q: %w", op, m.Subject, err)
	}
	return nil, true, nil
}

// batchAck is the server's answer to a batch's commit.
type batchAck struct {
	Seq   uint64              `json:"seq"`   // the batch's last message
	Count int                 `json:"count"` // messages stored
	Error *jetstream.APIError `json:"error"`
}

// Atomic batch headers and the server's error codes about batches.
const (
	batchIDHeader     = "Nats-Batch-Id"
	batchSeqHeader    = "Nats-Batch-Sequence"
	batchCommitHeader = "Nats-Batch-Commit"

	errCodeBatchDisabled        jetstream.ErrorCode = 10174
	errCodeBatchIncomplete      jetstream.ErrorCode = 10176
	errCodeBatchTooLarge        jetstream.ErrorCode = 10199
	errCodeBatchTooManyInflight jetstream.ErrorCode = 10210
	errCodeIDInProcess          jetstream.ErrorCode = 10158
)

// publishRetryable reports whether a message that failed with err may be
// sent again: always when the server refused it or never got it, and only
// with an id when it may have stored it (a lost ack).
func publishRetryable(err error, hasID bool) bool {
	var apiErr *jetstream.APIError
	switch {
	case errors.Is(err, jetstream.ErrNoStreamResponse), errors.Is(err, nats.ErrNoResponders):
		return true // no stream leader to store it: an election
	case errors.Is(err, nats.ErrReconnectBufExceeded):
		return true // not sent: the connection is down and keeps nothing (DialJetStream)
	case errors.As(err, &apiErr):
		// JetStream temporarily unavailable, or (replicated stream) the id
		// is still being stored by an earlier attempt; other refusals are
		// final.
		return apiErr.Code == 503 || apiErr.ErrorCode == errCodeIDInProcess
	case errors.Is(err, nats.ErrDisconnected), errors.Is(err, jetstream.ErrAsyncPublishTimeout):
		return hasID
	}
	return false
}

// publishBackoff waits wait before a publish is sent again, or until ctx
// is done (its error), and returns the next wait: twice as long, at most
// publishRetryMax.
func publishBackoff(ctx context.Context, wait time.Duration) (time.Duration, error) {
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return wait, ctx.Err()
	case <-t.C:
	}
	return min(2*wait, publishRetryMax), nil
}

// publishNoRetry turns off the library's own retry on "no responders":
// Publish retries itself, in order.
var publishNoRetry = jetstream.WithRetryAttempts(0)

const (
	// publishWindow is the most messages Publish sends as one atomic
	// batch: the server's default limit (its max_batch_size option can
	// lower it; Publish then halves its window until it fits).
	publishWindow = 1000
	// publishAckTimeout fails an ack that never comes, as when the stream
	// leader fails after receiving a message but before acknowledging it
	// to a publisher on another server (whose connection stays up). Acks
	// take milliseconds, even from a replicated stream under load.
	publishAckTimeout = 5 * time.Second
	// publishRetryMin and publishRetryMax space the attempts of Publish
	// during a failover; a NATS leader election takes about 2 s.
	publishRetryMin = 50 * time.Millisecond
	publishRetryMax = time.Second
)
