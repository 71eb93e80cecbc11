package cdc

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/fanwire/fanwire/broker"
	"github.com/fanwire/fanwire/jsonstr"
	"github.com/jackc/pglogrepl"
)

// change is one row change of a transaction, decoded from pgoutput's
// message. The tail decodes a held change into memory its changeDecoder
// reuses (hold.go): its values, tuples and columns are valid only while
// the change is applied (projected, observed); whoever keeps one copies it.
type change struct {
	kind   byte   // 'I', 'U', 'D' or 'T'
	xid    uint32 // the (sub)transaction that made it (streamed transactions)
	rel    uint32
	newRow *pglogrepl.TupleData
	oldRow *pglogrepl.TupleData // 'U' and 'D': the key ('K') or the whole old row ('O')
	// tbl is the table as the Relation message before the change defined
	// it (nil: none came): a change is encoded with the columns it was
	// written with, not those of a DDL later in its transaction.
	tbl     *table
	oldKind byte
	truncs  []*table // 'T': the truncated tables, as defined then
}

// txn is a committed transaction.
type txn struct {
	xid        uint32 // 0 for the bootstrap
	commitLSN  pglogrepl.LSN
	endLSN     pglogrepl.LSN
	commitTime time.Time
	enc        *eventEncoder // builds its table events while it is committed; nil: each event its own way
	changes    changeList    // held in memory, in order (none once spilled)
	arena      msgArena      // the held changes' messages
	mem        int64         // what changes take (heldSize), counted in reader.held
	spill      *spillFile    // the changes once the transaction outgrew Config.MaxTxnMemory; nil for most
}

// ops by change kind
var opNames = map[byte]string{'I': "insert", 'U': "update", 'D': "delete", 'T': "truncate"}

// rowEvent builds the event of a row change of a published table t. A row
// that cannot be encoded, or whose event is over the broker's limit,
// becomes its error event, returned with a *badRowError.
func rowEvent(t *table, c *change, id string, lsn pglogrepl.LSN, commitTime time.Time, op string) (broker.Outgoing, error) {
	if len(t.key) == 0 {
		bad := &badRowError{reason: badNoKey, source: "table " + t.nameKey, lsn: lsn, err: fmt.Errorf("table %s has no primary key nor replica identity index (%s): its rows have no subject; add a primary key", t.nameKey, t.noKey)}
		return errorEvent(t.errSubject, bad, nil, id, commitTime), bad
	}
	ev, keyJSON, keyText, err := encodeRowEvent(t, c, id, lsn, commitTime, op)
	reason := badValue
	if err == nil {
		if err = sizeError(ev, t.maxEvent); err == nil {
			return ev, nil
		}
		reason = badTooLarge
	}
	bad := &badRowError{reason: reason, source: "table " + t.nameKey, key: strings.Join(keyText, ","), lsn: lsn, err: err}
	return errorEvent(t.errSubject, bad, keyJSON, id, commitTime), bad
}

// encodeRowEvent builds the event of a row change, and returns its key as
// JSON and as text (as far as it got, on an error).
func encodeRowEvent(t *table, c *change, id string, lsn pglogrepl.LSN, commitTime time.Time, op string) (_ broker.Outgoing, keyJSON []byte, keyText []string, _ error) {
	keyRow := c.newRow
	if c.kind == 'D' || keyRow == nil {
		keyRow = c.oldRow
	}
	if keyRow == nil {
		return broker.Outgoing{}, nil, nil, fmt.Errorf("table %s: %s without a row", t.nameKey, op)
	}
	b := make([]byte, 0, 256)
	b = append(b, `{"id":"`...)
	b = append(b, id...)
	b = append(b, `","op":"`...)
	b = append(b, op...)
	b = append(b, `","key":`...)
	var err error
	keyText = make([]string, 0, len(t.key))
	keyStart := len(b)
	if len(t.key) > 1 {
		b = append(b, '[')
	}
	for n, i := range t.key {
		if n > 0 {
			b = append(b, ',')
		}
		if i >= len(keyRow.Columns) || keyRow.Columns[i].DataType != pglogrepl.TupleDataTypeText {
			return broker.Outgoing{}, nil, keyText, fmt.Errorf("table %s: %s without its key column %q", t.nameKey, op, t.columns[i].name)
		}
		col := keyRow.Columns[i]
		keyText = append(keyText, string(col.Data))
		if b, err = t.columns[i].ctype.Append(b, col.Data); err != nil {
			return broker.Outgoing{}, nil, keyText, fmt.Errorf("table %s column %s: %w", t.nameKey, t.columns[i].name, err)
		}
	}
	if len(t.key) > 1 {
		b = append(b, ']')
	}
	keyJSON = b[keyStart:len(b):len(b)]
	b = append(b, `,"lsn":"`...)
	b = append(b, lsn.String()...)
	b = append(b, `","commit_time":"`...)
	b = commitTime.UTC().AppendFormat(b, time.RFC3339Nano)
	b = append(b, `","doc":`...)
	if b, err = appendRowEvent(b, t, c); err != nil {
		return broker.Outgoing{}, keyJSON, keyText, err
	}
	return broker.Outgoing{Subject: t.subject + "." + keyToken(keyText), Data: b, ID: id}, keyJSON, keyText, nil
}

// eventEncoder builds the events of table changes with next to no
// allocations per event, byte for byte as rowEvent does: what is the same
// for every event of a transaction (its commit LSN and time, its ids'
// prefix) is formatted once, by begin; events' payloads are copied into
// shared blocks, their ids and subjects into shared strings, each event
// slicing its own part (a block lives as long as one of its events). The
// bootstrap's rows and the tail's committed transactions go this way; a
// change it cannot encode (a bad value, an event over the broker's limit)
// goes rowEvent's way, which makes its error event.
type eventEncoder struct {
	// writer starts every id (eventid.go); set before begin.
	writer string
	// mid is what comes between an event's key and its row:
	// ,"lsn":"<commit LSN>","commit_time":"<commit time>","doc":
	mid []byte
	// idPrefix and idSuffix are what comes before and after the index in a
	// table event's id (tableEventID).
	idPrefix, idSuffix []byte
	// Scratch space, reused from event to event: an id or subject, a
	// payload.
	strTmp, data []byte
	// The current blocks.
	dataBlock []byte
	strBlock  strings.Builder
}

// eventBlock is the size of the blocks of events' payloads; ids and
// subjects take blocks of a quarter of that.
const eventBlock = 64 << 10

// begin makes e build the events of a transaction committed at lsn and
// commitTime, under the flush window that opened at window (0: none;
// tableEventID).
func (e *eventEncoder) begin(lsn pglogrepl.LSN, commitTime time.Time, window pglogrepl.LSN) {
	e.mid = append(e.mid[:0], `,"lsn":"`...)
	e.mid = appendLSN(e.mid, lsn) // not lsn.String(): fmt's allocation was an eighth of a one-row transaction's
	e.mid = append(e.mid, `","commit_time":"`...)
	e.mid = commitTime.UTC().AppendFormat(e.mid, time.RFC3339Nano)
	e.mid = append(e.mid, `","doc":`...)
	e.idPrefix = append(append(e.idPrefix[:0], e.writer...), ':')
	e.idPrefix = append(strconv.AppendUint(e.idPrefix, uint64(lsn), 16), '-')
	e.idSuffix = e.idSuffix[:0]
	if window != 0 {
		e.idSuffix = strconv.AppendUint(append(e.idSuffix, '-'), uint64(window), 16)
	}
}

// tableID is tableEventID of the table event of the transaction's i-th
// change.
func (e *eventEncoder) tableID(i int) string {
	b := append(e.strTmp[:0], e.idPrefix...)
	b = strconv.AppendInt(b, int64(i), 10)
	e.strTmp = append(b, e.idSuffix...)
	return e.keepString(e.strTmp)
}

// rowEvent builds the event of change c of published table t, as rowEvent
// does; ok is false when it cannot (a value that cannot be encoded, a key
// missing, an event over the broker's limit): rowEvent makes its error
// event.
func (e *eventEncoder) rowEvent(t *table, c *change, id, op string) (_ broker.Outgoing, ok bool) {
	keyRow := c.newRow
	if c.kind == 'D' || keyRow == nil {
		keyRow = c.oldRow
	}
	if keyRow == nil || len(t.key) == 0 {
		return broker.Outgoing{}, false
	}
	s := append(e.strTmp[:0], t.subject...)
	s = append(s, '.')
	for n, i := range t.key {
		if n > 0 {
			s = append(s, ',')
		}
		if i >= len(keyRow.Columns) || keyRow.Columns[i].DataType != pglogrepl.TupleDataTypeText {
			return broker.Outgoing{}, false
		}
		s = appendSubjectToken(s, keyRow.Columns[i].Data)
	}
	e.strTmp = s
	b := append(e.data[:0], `{"id":"`...)
	b = append(b, id...)
	b = append(b, `","op":"`...)
	b = append(b, op...)
	b = append(b, `","key":`...)
	if len(t.key) > 1 {
		b = append(b, '[')
	}
	var err error
	for n, i := range t.key {
		if n > 0 {
			b = append(b, ',')
		}
		if b, err = t.columns[i].ctype.Append(b, keyRow.Columns[i].Data); err != nil {
			return broker.Outgoing{}, false
		}
	}
	if len(t.key) > 1 {
		b = append(b, ']')
	}
	b = append(b, e.mid...)
	if b, err = appendRowEvent(b, t, c); err != nil {
		return broker.Outgoing{}, false
	}
	e.data = b
	if overLimit(len(b)+len(s), t.maxEvent) {
		return broker.Outgoing{}, false
	}
	return broker.Outgoing{Subject: e.keepString(s), Data: e.keep(b), ID: id}, true
}

// keep copies p into the current payload block and returns the copy.
func (e *eventEncoder) keep(p []byte) []byte {
	if cap(e.dataBlock)-len(e.dataBlock) < len(p) {
		e.dataBlock = make([]byte, 0, max(eventBlock, len(p)))
	}
	start := len(e.dataBlock)
	e.dataBlock = append(e.dataBlock, p...)
	return e.dataBlock[start:len(e.dataBlock):len(e.dataBlock)]
}

// keepString copies p into the current string block and returns it as a
// string. (A strings.Builder never changes what it has made a string: it
// only appends, and the block is replaced, never grown, when full.)
func (e *eventEncoder) keepString(p []byte) string {
	if e.strBlock.Cap()-e.strBlock.Len() < len(p) {
		e.strBlock = strings.Builder{}
		e.strBlock.Grow(max(eventBlock/4, len(p)))
	}
	start := e.strBlock.Len()
	e.strBlock.Write(p)
	return e.strBlock.String()[start:]
}

// appendRowEvent appends what follows the commit time in change c's event:
// the row ("doc"), the old row and the unchanged columns, and the closing
// brace.
func appendRowEvent(b []byte, t *table, c *change) ([]byte, error) {
	var old *pglogrepl.TupleData
	if c.oldKind == 'O' {
		old = c.oldRow
	}
	var unchanged []string
	var err error
	if c.kind == 'D' {
		b = append(b, "null"...)
	} else if b, unchanged, err = appendRow(b, t, c.newRow, old, false); err != nil {
		return nil, err
	}
	if c.oldRow != nil && c.kind != 'I' {
		b = append(b, `,"old":`...)
		if b, _, err = appendRow(b, t, c.oldRow, nil, c.oldKind == 'K'); err != nil {
			return nil, err
		}
	}
	if len(unchanged) > 0 {
		b = append(b, `,"unchanged":[`...)
		for i, u := range unchanged {
			if i > 0 {
				b = append(b, ',')
			}
			b = jsonstr.AppendBytes(b, []byte(u))
		}
		b = append(b, ']')
	}
	return append(b, '}'), nil
}

// appendRow appends a row as a JSON object. A column whose value did not
// change and was not sent (an unchanged TOAST value, 'u') is taken from
// old when old has it (REPLICA IDENTITY FULL); otherwise it is left out
// and named in unchanged, never written as null. A key-only old row ('K')
// (keyOnly) has nulls for its other columns: those are left out.
func appendRow(b []byte, t *table, row, old *pglogrepl.TupleData, keyOnly bool) (_ []byte, unchanged []string, err error) {
	b = append(b, '{')
	first := true
	for i, col := range row.Columns {
		if i >= len(t.columns) {
			return nil, nil, fmt.Errorf("table %s: a row with %d columns, the relation has %d", t.nameKey, len(row.Columns), len(t.columns))
		}
		if keyOnly && col.DataType == pglogrepl.TupleDataTypeNull && !slices.Contains(t.key, i) {
			continue
		}
		data, typ := col.Data, col.DataType
		if typ == pglogrepl.TupleDataTypeToast && old != nil && i < len(old.Columns) && old.Columns[i].DataType == pglogrepl.TupleDataTypeText {
			data, typ = old.Columns[i].Data, pglogrepl.TupleDataTypeText
		}
		if typ == pglogrepl.TupleDataTypeToast {
			unchanged = append(unchanged, t.columns[i].name)
			continue
		}
		if !first {
			b = append(b, ',')
		}
		first = false
		b = append(b, t.columns[i].jsonName...)
		switch typ {
		case pglogrepl.TupleDataTypeNull:
			b = append(b, "null"...)
		case pglogrepl.TupleDataTypeText:
			if b, err = t.columns[i].ctype.Append(b, data); err != nil {
				return nil, nil, fmt.Errorf("table %s column %s: %w", t.nameKey, t.columns[i].name, err)
			}
		default:
			return nil, nil, fmt.Errorf("table %s column %s: tuple data type %q (binary values are not requested)", t.nameKey, t.columns[i].name, typ)
		}
	}
	return append(b, '}'), unchanged, nil
}

// truncateEvent is the one event of a truncated table.
func truncateEvent(t *table, id string, lsn pglogrepl.LSN, commitTime time.Time) broker.Outgoing {
	return truncateEventOn(t.subject, id, lsn, commitTime)
}

// truncateEventOn is a truncate event on subject's truncate token: a
// table's, or a projection's whose primary table was truncated.
func truncateEventOn(subject, id string, lsn pglogrepl.LSN, commitTime time.Time) broker.Outgoing {
	b := make([]byte, 0, 128)
	b = append(b, `{"id":"`...)
	b = append(b, id...)
	b = append(b, `","op":"truncate","key":null,"lsn":"`...)
	b = append(b, lsn.String()...)
	b = append(b, `","commit_time":"`...)
	b = commitTime.UTC().AppendFormat(b, time.RFC3339Nano)
	b = append(b, `","doc":null}`...)
	return broker.Outgoing{Subject: subject + "." + truncateToken, Data: b, ID: id}
}
