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
	dst = appendHead(dst, seq, ts)
	return appendPad(dst, start, size)
}

// appendDocPayload appends a view run's event payload (views_config.go):
// {"seq":N,"ts":T,"doc":{"customer_id":k,"total":k.5},"pad":"xx…"}, size
// bytes long as appendPayload's, the document being customer k's. The
// parser's fast path reads seq and ts before the document.
func appendDocPayload(dst []byte, seq uint64, ts int64, size int, customer uint64) []byte {
	start := len(dst)
	dst = appendHead(dst, seq, ts)
	dst = append(dst, `,"doc":{"customer_id":`...)
	dst = strconv.AppendUint(dst, customer, 10)
	dst = append(dst, `,"total":`...)
	dst = strconv.AppendUint(dst, customer, 10)
	dst = append(dst, `.5}`...)
	return appendPad(dst, start, size)
}

// appendHead appends a payload's fixed start: {"seq":N,"ts":T
func appendHead(dst []byte, seq uint64, ts int64) []byte {
	dst = append(dst, `{"seq":`...)
	dst = strconv.AppendUint(dst, seq, 10)
	dst = append(dst, `,"ts":`...)
	return strconv.AppendInt(dst, ts, 10)
}

// appendPad closes a payload that started at start, padding it to size
// bytes when there is room.
func appendPad(dst []byte, start, size int) []byte {
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
