package loadtest

import "strconv"

// padding is sliced to pad payloads; sizes past it are padded in chunks.
const padding = "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx" +
	"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx" +
	"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx" +
	"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"

// appendPayload appends the event payload for seq, published at ts (unix
// nanoseconds), to dst: compact JSON {"seq":N,"ts":T,"pad":"xx…"} exactly size
// bytes long. When size is too small for the fixed part the pad field is left
// out and the payload is longer than size. The key order (seq, ts, pad) keeps
// the parser's searches out of the padding.
func appendPayload(dst []byte, seq uint64, ts int64, size int) []byte {
	start := len(dst)
	dst = append(dst, `{"seq":`...)
	dst = strconv.AppendUint(dst, seq, 10)
	dst = append(dst, `,"ts":`...)
	dst = strconv.AppendInt(dst, ts, 10)
	pad := size - (len(dst) - start) - len(`,"pad":""}`)
	if pad < 0 {
		return append(dst, '}')
	}
	dst = append(dst, `,"pad":"`...)
	for pad > 0 {
		n := min(pad, len(padding))
		dst = append(dst, padding[:n]...)
		pad -= n
	}
	return append(dst, `"}`...)
}
