package broker

// SetFeedBuffer sets how many messages b's live feed holds for a busy
// handler, so that a test can make it fall behind the stream with a few
// hundred events instead of 64Ki.
func SetFeedBuffer(b *JetStream, n int) { b.buffer = n }

// SetNATSBuffer sets how many messages b's Consume holds for a busy
// handler, so that a test can make the library drop with a small flood.
func SetNATSBuffer(b *NATS, n int) { b.buffer = n }

// SetLatestHooks makes b's Latest call afterThrough once it has read the
// position it reads as of (through), before it creates its consumer.
func SetLatestHooks(b *JetStream, afterThrough func()) { b.latest.afterThrough = afterThrough }

// SetRedisLatestHooks makes b's Latest call afterThrough once it has read
// through, before it reads the index, and afterScan once it has read the
// index, before it fetches any entry.
func SetRedisLatestHooks(b *Redis, afterThrough, afterScan func()) {
	b.latest.afterThrough, b.latest.afterScan = afterThrough, afterScan
}

// SetRedisLatestScanned makes b's Latest call scanned after each page of
// the index it reads, with how many entries it holds then.
func SetRedisLatestScanned(b *Redis, scanned func(held int)) { b.latest.scanned = scanned }

// PublishFinds is how many of b's fast-batch Publishes had to search the
// stream for their messages' sequences (others' messages came between).
func PublishFinds(b *JetStream) int64 { return b.pubFinds.Load() }

// PublishTagReads is how many messages b's fast-batch Publishes read back
// to find their sequences.
func PublishTagReads(b *JetStream) int64 { return b.pubTagReads.Load() }

// SetPublishHooks makes b's fast-batch Publish call afterFirst once it
// has sent a batch's first message, before the second.
func SetPublishHooks(b *JetStream, afterFirst func()) { b.pubHooks.afterFirst = afterFirst }
