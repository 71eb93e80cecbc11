package broker

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"strconv"
	"sync"

	"go.uber.org/zap"
)

// Publish's fast path: a fast batch, then the cursors.
//
// A fast batch (see Append) keeps the order Publish promises: the server
// stores its messages as they come, in order, and ends the batch at the
// first message it refuses or misses, so nothing after it is stored. It
// is not staged in a store of its own as an atomic batch is (a file
// store created, synced and removed per batch: in the deployed fan-out
// benchmark, 200 clients × 20,000 events published 100 per request,
// nats-server spent about 40 µs of CPU per event on it, and JetStream
// delivered 0.65× of Core NATS).
//
// What a fast batch does not give is each message's sequence: the server's
// final answer names the last one's (S) and how many it took (n). Alone on
// the stream, the batch is stored contiguously: message k at S-n+k. But
// another publisher (another request on this node, another node, the
// ingest) may have stored messages in between. So every message carries
// a tag (pubTagHeader: the batch's random id and its place), and Publish
// reads one message back, at S-n+1: if it is the batch's first, the n
// messages fill the n sequences up to S, and the cursors follow. If not,
// it reads back from S until it has found every tag, or the batch's
// first, or reached the last sequence it knew stored before it sent the
// batch (seqSeen): every message of the batch is after that one. Without
// that floor a removed message (a stream with max_msgs_per_subject drops
// the batch's earlier messages of a subject as its later ones arrive)
// sent the search down to the stream's first message: 10,009 reads for a
// batch of 5 on a stream of 10,000 (TestJetStreamPublishReadBackBounded).
//
// Why not pipelined single publishes, each acked with its sequence (the
// way before atomic batches)? They cost an ack per message, and when one
// fails (a leader election, a lost connection, a refused message) a later
// one may be stored: the order breaks. Why not a chain of conditions
// (Nats-Expected-Last-Msg-Id)? Another publisher's message breaks the
// chain, and on a replicated stream a refused id stays "in process" for
// the duplicate window (see Publish).
//
// Only messages without ids take this path: a repeated id is skipped
// within a fast batch without a word, so its sequence (the original's)
// could not be told apart from a foreign message's. Batches with ids go as
// atomic batches, whose refusal of a known id sorts that out.

// pubTagHeader carries a fast-batch Publish's tag: "<batch id>.<place>",
// the place counted from 1. Consumers may ignore it.
const pubTagHeader = "Fanwire-Pub"

// pubFindParallel is how many messages publishCursors reads back at once
// when another publisher's messages came between the batch's.
const pubFindParallel = 32

// publishFast stores msgs, none of which has an id, as fast batches and
// records their cursors. It reports done=false when the stream turned out
// to take no fast batches, with the messages from the first one without a
// cursor left for the atomic path.
func (b *JetStream) publishFast(ctx context.Context, msgs []Outgoing, cursors []string) (done bool, err error) {
	wait := publishRetryMin
	for attempt, start := 0, 0; start < len(msgs); {
		rest := msgs[start:]
		tag := rand.Text() // 26 characters, unique per batch
		floor := b.seqSeen.Load()
		r := b.appendBatch(ctx, rest, tag)
		b.observe(r.last)
		if r.next == fastFailed {
			return true, fmt.Errorf("jetstream publish: %w", r.err)
		}
		if r.stored > 0 {
			if err := b.publishCursors(ctx, tag, r.stored, r.last, floor, cursors[start:start+r.stored]); err != nil {
				return true, err
			}
			start += r.stored
			wait, attempt = publishRetryMin, 0
		}
		switch r.next {
		case fastDone:
			continue
		case fastSwitched:
			return false, nil
		case fastEach:
			// A message refused, or missing: each after it goes alone, with
			// its own answer, until one is stored anew; then a fast batch
			// again.
			if start == len(msgs) {
				continue
			}
			ack, again, err := b.publishOne(ctx, msgs[start], "publish")
			if err != nil {
				return true, err
			}
			if !again {
				cursors[start] = FormatJSCursor(ack.Sequence)
				start++
				continue
			}
			r.why = "a message not acknowledged"
		}
		if attempt == 0 {
			b.core.log.Warn("jetstream publish not acknowledged (failover?); sending again", zap.Int("messages", len(msgs)-start), zap.String("reason", r.why))
		}
		attempt++
		if wait, err = publishBackoff(ctx, wait); err != nil {
			return true, fmt.Errorf("jetstream publish: %d messages not acknowledged: %w", len(msgs)-start, err)
		}
	}
	return true, nil
}

// publishCursors fills cursors, those of the first n messages of the fast
// batch tagged tag, whose last is at stream sequence last (0: unknown),
// and which were all stored after sequence floor.
func (b *JetStream) publishCursors(ctx context.Context, tag string, n int, last, floor uint64, cursors []string) error {
	if last == 0 {
		// The server stored them but did not say where (a final answer
		// that was an error): they are before the stream's end.
		info, err := b.stream.Info(ctx)
		if err != nil {
			return fmt.Errorf("jetstream publish: %d messages stored, finding their sequences: %w", n, err)
		}
		last = info.State.LastSeq
		b.observe(last)
	}
	if last < floor+uint64(n) {
		// n messages do not fit after floor: the stream was numbered
		// lower since (deleted and re-created by hand). Search it all.
		floor = 0
	}
	if last >= uint64(n) {
		first := last - uint64(n) + 1
		h, err := b.storedTag(ctx, first)
		if err != nil {
			return fmt.Errorf("jetstream publish: %d messages stored, reading back the first: %w", n, err)
		}
		if h == tag+".1" {
			// The batch's first is at last-n+1, its last at last: n
			// messages in n sequences, in order.
			for i := range cursors {
				cursors[i] = FormatJSCursor(first + uint64(i))
			}
			return nil
		}
	}
	return b.findTagged(ctx, tag, n, last, floor, cursors)
}

// findTagged reads the stream back from last, pubFindParallel messages at
// a time, until it has found the n messages tagged tag, or the batch's
// first (the others are after it), or reached floor (a sequence stored
// before the batch was sent) or the stream's first message. Those it did
// not find were removed already (a stream kept small by max_bytes that
// the batch itself overflowed, or by max_msgs_per_subject): they get the
// sequences that continue the earliest one found downwards, each at or
// after its message's place: below the stream's first (expired, like
// theirs) when the stream's head went, within the stream when
// max_msgs_per_subject removed them.
func (b *JetStream) findTagged(ctx context.Context, tag string, n int, last, floor uint64, cursors []string) error {
	b.pubFinds.Add(1)
	prefix := []byte(tag + ".")
	found := 0
	seqs := make([]uint64, pubFindParallel)
	tags := make([]string, pubFindParallel)
	errs := make([]error, pubFindParallel)
	low := floor      // every message of the batch is after low
	askedLow := false // whether the stream's first sequence raised low
	for hi := last; found < n && cursors[0] == "" && hi > low; {
		k := int(min(uint64(pubFindParallel), hi-low))
		var wg sync.WaitGroup
		for j := range k {
			seqs[j] = hi - uint64(j)
			wg.Go(func() { tags[j], errs[j] = b.storedTag(ctx, seqs[j]) })
		}
		wg.Wait()
		seen := false
		for j := range k {
			if errs[j] != nil {
				return fmt.Errorf("jetstream publish: %d messages stored, finding their sequences: %w", n, errs[j])
			}
			seen = seen || tags[j] != ""
			place, ok := bytes.CutPrefix([]byte(tags[j]), prefix)
			if !ok {
				continue
			}
			i, err := strconv.Atoi(string(place))
			if err != nil || i < 1 || i > n || cursors[i-1] != "" {
				continue
			}
			cursors[i-1] = FormatJSCursor(seqs[j])
			found++
		}
		hi -= uint64(k)
		if !seen && !askedLow && found < n {
			info, err := b.stream.Info(ctx)
			if err != nil {
				return fmt.Errorf("jetstream publish: %d messages stored, finding their sequences: %w", n, err)
			}
			b.observe(info.State.LastSeq)
			if f := info.State.FirstSeq; f > 1 {
				low = max(low, f-1)
			}
			askedLow = true
		}
	}
	if found == n {
		return nil
	}
	// Removed before they were read back: below the earliest found (or
	// below last+1, when none was found), in order.
	below := last + 1
	for i := n - 1; i >= 0; i-- {
		if cursors[i] != "" {
			below, _ = ParseJSCursor(cursors[i])
			continue
		}
		below = max(below, 2) - 1
		cursors[i] = FormatJSCursor(below)
	}
	return nil
}

// storedTag returns the pubTagHeader of the message stored at seq ("" when
// it has none, or there is no message there: deleted, or expired), as the
// stream's leader has it (msgGet).
func (b *JetStream) storedTag(ctx context.Context, seq uint64) (string, error) {
	b.pubTagReads.Add(1)
	rctx, cancel := context.WithTimeout(ctx, publishAckTimeout)
	defer cancel()
	_, hdr, err := b.msgGet(rctx, struct {
		Seq uint64 `json:"seq"`
	}{seq})
	if err != nil {
		return "", fmt.Errorf("message get %d: %w", seq, err)
	}
	return hdr.Get(pubTagHeader), nil
}
