package broker

// Limited is implemented by brokers that refuse messages over a size:
// a publisher that must not stop on one message (the ingest) checks each
// against MaxMessage before publishing it. Redis Streams takes values up to
// its proto-max-bulk-len (512 MB by default) and does not implement it.
type Limited interface {
	// MaxMessage is the largest subject plus payload Publish takes, in
	// bytes (room is left for the headers Publish adds).
	MaxMessage() int
}

// headerRoom is what MaxMessage leaves for the headers Publish adds (the
// idempotency id and its framing).
const headerRoom = 512

// MaxMessage is the server's max_payload less room for headers.
func (b *NATS) MaxMessage() int { return int(b.nc.MaxPayload()) - headerRoom }

// MaxMessage is the server's max_payload, or the stream's max_msg_size
// when that is smaller, less room for headers.
func (b *JetStream) MaxMessage() int {
	n := b.core.MaxMessage()
	if m := int(b.stream.CachedInfo().Config.MaxMsgSize); m > 0 && m-headerRoom < n {
		n = m - headerRoom
	}
	return n
}
