package gateway

import "github.com/fanwire/fanwire/gateway/internal/fanout"

// The GraphQL writer: a GraphQL connection's batches become one next (or
// data) message per operation per event.

// writeBatchGQL writes each delivery as its own message (the protocol's
// framing), batched: it frames the messages itself, straight into the
// socket writer's batch buffer (a fast-path delivery is spliced there, with
// no intermediate copy), which leaves in one write per batchLimit. While a
// library frame is partway through (rare: a ping), it writes through the
// library instead.
func (c *conn) writeBatchGQL(bt *fanout.Batch) error {
	fw := c.fw
	batched := fw.BeginBatch()
	var bp *[]byte
	var buf []byte
	var frames, bytes int
	var err error
	write := func(b []byte) error { // a prebuilt message
		if !batched {
			return c.writeFrame(b)
		}
		frames, bytes = frames+1, bytes+len(b)
		return fw.AppendText(b)
	}
items:
	for s := bt.First(); s != nil; s = bt.Next(s) {
		for _, it := range bt.Used(s) {
			if it.Subs == nil {
				if err = write(it.Ev.Bytes()); err != nil {
					break items
				}
				continue
			}
			for _, op := range gqlOps(it.Subs) {
				if op.done.Load() {
					continue
				}
				if batched && op.fast {
					n := op.nextLen(it.Ev)
					fw.AppendHeader(n)
					fw.Out = op.appendNext(fw.Out, it.Ev)
					frames, bytes = frames+1, bytes+n
					if err = fw.FlushIfFull(); err != nil {
						break items
					}
					continue
				}
				if bp == nil {
					bp = getFrameBuf()
					buf = (*bp)[:0]
				}
				buf = op.appendNext(buf[:0], it.Ev)
				if len(buf) == 0 { // the operation ended
					continue
				}
				if err = write(buf); err != nil {
					break items
				}
			}
		}
	}
	if batched {
		if eerr := fw.EndBatch(); err == nil {
			err = eerr
		}
	}
	if bp != nil {
		*bp = buf
		putFrameBuf(bp)
	}
	c.s.metrics.Frames.Add(float64(frames))
	c.s.metrics.BytesSent.Add(float64(bytes))
	c.sent.Add(uint64(bytes))
	return err
}
