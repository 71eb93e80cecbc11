package cdc

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/fanwire/fanwire/broker"
	"github.com/jackc/pglogrepl"
)

// change is one row change of a transaction, as pgoutput sent it.
type change struct {
	kind    byte   // 'I', 'U', 'D' or 'T'
	xid     uint32 // the (sub)transaction that made it (streamed transactions)
	rel     uint32
	newRow  *pglogrepl.TupleData
	oldRow  *pglogrepl.TupleData // 'U' and 'D': the key ('K') or the whole old row ('O')
	oldKind byte
	truncs  []uint32 // 'T': the truncated relations
}

// txn is a committed transaction.
type txn struct {
	xid        uint32 // 0 for the bootstrap
	commitLSN  pglogrepl.LSN
	endLSN     pglogrepl.LSN
	commitTime time.Time
	changes    []change   // held in memory, in order (none once spilled)
	mem        int64      // what changes take (changeSize), counted in reader.held
	spill      *spillFile // the changes once the transaction outgrew Config.MaxTxnMemory; nil for most
}

// ops by change kind
var opNames = map[byte]string{'I': "insert", 'U': "update", 'D': "delete", 'T': "truncate"}

// rowEvent builds the event of a row change of a published table t. A row
// that cannot be encoded, or whose event is over the broker's limit,
// becomes its error event, returned with a *badRowError.
func rowEvent(t *table, c *change, id string, lsn pglogrepl.LSN, commitTime time.Time, op string) (broker.Outgoing, error) {
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
		if b, err = t.columns[i].ctype.appendValue(b, col.Data); err != nil {
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
	var old *pglogrepl.TupleData
	if c.oldKind == 'O' {
		old = c.oldRow
	}
	var unchanged []string
	if c.kind == 'D' {
		b = append(b, "null"...)
	} else if b, unchanged, err = appendRow(b, t, c.newRow, old, false); err != nil {
		return broker.Outgoing{}, keyJSON, keyText, err
	}
	if c.oldRow != nil && c.kind != 'I' {
		b = append(b, `,"old":`...)
		if b, _, err = appendRow(b, t, c.oldRow, nil, c.oldKind == 'K'); err != nil {
			return broker.Outgoing{}, keyJSON, keyText, err
		}
	}
	if len(unchanged) > 0 {
		b = append(b, `,"unchanged":[`...)
		for i, u := range unchanged {
			if i > 0 {
				b = append(b, ',')
			}
			b = AppendJSONString(b, []byte(u))
		}
		b = append(b, ']')
	}
	b = append(b, '}')
	return broker.Outgoing{Subject: t.subject + "." + keyToken(keyText), Data: b, ID: id}, keyJSON, keyText, nil
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
			if b, err = t.columns[i].ctype.appendValue(b, data); err != nil {
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
