package cdc

import (
	"errors"
	"fmt"
	"time"

	"github.com/fanwire/fanwire/broker"
	"github.com/fanwire/fanwire/jsonstr"
	"github.com/jackc/pglogrepl"
	"go.uber.org/zap"
)

// A row or document that cannot become its event — a value the encoder
// refuses, or an event larger than the broker takes — must not stop the
// ingest: retrying cannot fix it, so the reader would reconnect, meet the
// same row and fail again, forever (a bootstrap would start over each
// time). It becomes an error event instead, in the place and with the id
// of the event it stands for, on <prefix>.%errors.<table or projection>
// ('%' cannot start a table's or a key's token, so no table's subject can
// be taken for it), and is counted and logged.

// errorsToken is the token after the prefix of every error event's subject.
const errorsToken = "%errors"

// errorSubject is the error events' subject of a table or projection whose
// events go to subject (under prefix).
func errorSubject(prefix, subject string) string {
	return prefix + "." + errorsToken + subject[len(prefix):]
}

// Reasons for an error event, the label of fanwire_ingest_error_events_total.
const (
	badValue    = "bad_value" // a column value the encoder refuses
	badTooLarge = "too_large" // an event over the broker's message size limit
	badNoKey    = "no_key"    // a row of a table with no key (no primary key, no replica identity index)
	badReasons  = 3
)

// badRowError is a row or document that became an error event.
type badRowError struct {
	reason string
	source string // "table public.orders" or "projection orders"
	key    string // the key's text (composite: its values joined with ',')
	lsn    pglogrepl.LSN
	err    error
}

func (e *badRowError) Error() string {
	return fmt.Sprintf("%s key %q at %s: %v", e.source, e.key, e.lsn, e.err)
}

func (e *badRowError) Unwrap() error { return e.err }

// asBadRow reports whether err is a bad row's.
func asBadRow(err error) (*badRowError, bool) {
	if err == nil { // most: errors.As's target would be allocated for nothing
		return nil, false
	}
	var bad *badRowError
	ok := errors.As(err, &bad)
	return bad, ok
}

// ErrEventTooLarge is wrapped by the error of an event larger than the
// broker's message size limit.
var ErrEventTooLarge = errors.New("event too large for the broker")

// errorEvent is the event that stands for a bad row or document: id, lsn
// and commit time are the ones its event would have had; key is the key as
// JSON when it could be encoded, else nil (its text is then a string).
func errorEvent(subject string, bad *badRowError, key []byte, id string, commitTime time.Time) broker.Outgoing {
	b := make([]byte, 0, 256)
	b = append(b, `{"id":"`...)
	b = append(b, id...)
	b = append(b, `","op":"error","source":`...)
	b = jsonstr.AppendBytes(b, []byte(bad.source))
	b = append(b, `,"key":`...)
	if key != nil {
		b = append(b, key...)
	} else {
		b = jsonstr.AppendBytes(b, []byte(bad.key))
	}
	b = append(b, `,"lsn":"`...)
	b = append(b, bad.lsn.String()...)
	b = append(b, `","commit_time":"`...)
	b = commitTime.UTC().AppendFormat(b, time.RFC3339Nano)
	b = append(b, `","reason":"`...)
	b = append(b, bad.reason...)
	b = append(b, `","error":`...)
	b = jsonstr.AppendBytes(b, []byte(bad.err.Error()))
	b = append(b, '}')
	return broker.Outgoing{Subject: subject, Data: b, ID: id}
}

// sizeError says why an event over limit bytes (0: no limit) cannot be
// published; nil when it can.
func sizeError(ev broker.Outgoing, limit int) error {
	if n := len(ev.Data) + len(ev.Subject); overLimit(n, limit) {
		return fmt.Errorf("%w: %d bytes, the limit is %d", ErrEventTooLarge, n, limit)
	}
	return nil
}

// overLimit reports whether an event of n bytes (payload and subject) is
// over limit (0: no limit).
func overLimit(n, limit int) bool { return limit > 0 && n > limit }

// reportBad counts and logs a bad row or document; its error event is on
// its way.
func (in *Ingest) reportBad(bad *badRowError) {
	i := 0
	switch bad.reason {
	case badTooLarge:
		i = 1
	case badNoKey:
		i = 2
	}
	in.badRows[i].Add(1)
	in.log.Error("ingest: a row cannot be published; an error event stands for it",
		zap.String("reason", bad.reason), zap.String("source", bad.source), zap.String("key", bad.key),
		zap.Stringer("lsn", bad.lsn), zap.Error(bad.err))
}
