package cdc

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"math/big"
	"slices"
	"strconv"

	"github.com/fanwire/fanwire/cdc/pgjson"
)

// Composing documents from the memory state, with no query: a document
// is its primary row and, through the state's indexes, its children, as of
// the transaction being published; a many list is ordered as the sql
// mode's ORDER BY orders it, for the types an ordering column usually has
// (compareText).

// prepare: the state is as of transaction t already.
func (s *memState) prepare(context.Context, *docChanges, *txn) error { return nil }

// recompose composes the documents of keys from the state, as of this
// commit (no query), into buf, reused from the last call.
func (s *memState) recompose(_ context.Context, p *docProjection, keys, docs [][]byte, bad []error, buf []byte) ([]byte, error) {
	buf = buf[:0]
	for i, k := range keys {
		start := len(buf)
		var ok bool
		buf, ok, bad[i] = s.appendMemDoc(buf, p, k)
		if ok && bad[i] == nil {
			docs[i] = buf[start:len(buf):len(buf)]
		}
	}
	return buf, nil
}

// memCompose composes the document of p with key from the state (nil: the
// primary row does not exist).
func (s *memState) memCompose(p *docProjection, key []byte) ([]byte, error) {
	doc, ok, err := s.appendMemDoc(nil, p, key)
	if !ok || err != nil {
		return nil, err
	}
	return doc, nil
}

// memScratch is what composing documents from the state reuses from one
// document to the next (the reader's goroutine owns it, with the state):
// the map key being looked up, and per nesting depth the fields of the row
// being appended and the rows of one of its children.
type memScratch struct {
	key    []byte
	levels []memLevel
}

type memLevel struct {
	fields [][]byte
	kids   [][]byte
}

// appendMemDoc appends the document of p with key, composed from the
// state, to b; ok is false when its primary row does not exist. On an
// error, b is returned as it was.
func (s *memState) appendMemDoc(b []byte, p *docProjection, key []byte) (_ []byte, ok bool, _ error) {
	root := p.root
	sc := &s.scratch
	sc.key = appendTupleValue(sc.key[:0], key)
	t := root.mem.t
	id := t.find(sc.key)
	if id == 0 {
		return b, false, nil
	}
	row := t.row(id)
	out, err := sc.appendRow(b, root, row, 0)
	if err != nil {
		return b, true, err
	}
	return out, true, nil
}

// appendRow appends row (of node n, at nesting depth) as a JSON object
// with its embeds, as appendDoc does a composedRow.
func (sc *memScratch) appendRow(b []byte, n *docNode, row []byte, depth int) ([]byte, error) {
	for len(sc.levels) <= depth {
		sc.levels = append(sc.levels, memLevel{})
	}
	lv := &sc.levels[depth]
	lv.fields = rowFields(lv.fields[:0], row)
	fields := lv.fields
	info := n.mem
	b = append(b, '{')
	var err error
	for i, c := range n.cols {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, c.jsonName...)
		v := fields[info.docCols[i]]
		if v == nil {
			b = append(b, "null"...)
			continue
		}
		if b, err = c.ctype.Append(b, v); err != nil {
			return nil, fmt.Errorf("projection %q, %s column %s: %w", n.proj.spec.Name, n.nameKey, c.name, err)
		}
	}
	for ci, child := range n.children {
		if len(n.cols) > 0 || ci > 0 {
			b = append(b, ',')
		}
		b = append(b, child.as...)
		// The child's rows: by the values it joins on (NULL joins nothing).
		kids := lv.kids[:0]
		sc.key = sc.key[:0]
		joined := true
		for i, c := range child.mem.onParent {
			v := fields[c]
			if v == nil {
				joined = false
				break
			}
			sc.key = appendTupleValue(sc.key, joinText(child.mem.onOID[i], v))
		}
		if joined {
			kids = child.mem.byJoin.appendRows(kids, sc.key)
		}
		lv.kids = kids
		if !child.many {
			if len(kids) == 0 {
				b = append(b, "null"...)
				continue
			}
			if b, err = sc.appendRow(b, child, kids[0], depth+1); err != nil {
				return nil, err
			}
			continue
		}
		if len(kids) > 1 {
			info := child.mem
			slices.SortFunc(kids, func(a, b []byte) int {
				for i, c := range info.order {
					if x := compareText(info.orderOID[i], rowField(a, c), rowField(b, c)); x != 0 {
						return x
					}
				}
				return 0
			})
		}
		b = append(b, '[')
		for k, cr := range kids {
			if k > 0 {
				b = append(b, ',')
			}
			if b, err = sc.appendRow(b, child, cr, depth+1); err != nil {
				return nil, err
			}
		}
		b = append(b, ']')
	}
	return append(b, '}'), nil
}

// compareText orders two values of a type as PostgreSQL's ORDER BY does for
// the types a key or an ordering column usually has: numbers numerically
// (-Infinity first, then NaN last), dates and timestamps by time (BC years
// and years past 9999 included, -infinity first, infinity last), everything
// else by bytes (the C collation). NULLs sort last.
func compareText(oid uint32, a, b []byte) int {
	switch {
	case a == nil && b == nil:
		return 0
	case a == nil:
		return 1
	case b == nil:
		return -1
	}
	switch oid {
	case 20, 21, 23, 26: // int8, int2, int4, oid
		x, err1 := strconv.ParseInt(string(a), 10, 64)
		y, err2 := strconv.ParseInt(string(b), 10, 64)
		if err1 == nil && err2 == nil {
			switch {
			case x < y:
				return -1
			case x > y:
				return 1
			}
			return 0
		}
	case 700, 701, 1700: // float4, float8, numeric
		if x := cmp.Compare(numberRank(a), numberRank(b)); x != 0 || numberRank(a) != 0 {
			return x
		}
		x, ok1 := new(big.Float).SetString(string(a))
		y, ok2 := new(big.Float).SetString(string(b))
		if ok1 && ok2 {
			return x.Cmp(y)
		}
	case 1082, 1114, 1184: // date, timestamp, timestamptz (in UTC: every offset is +00)
		if x := cmp.Compare(infinityRank(a), infinityRank(b)); x != 0 || infinityRank(a) != 0 {
			return x
		}
		da, ra, ok1 := pgjson.ParseISODate(a)
		db, rb, ok2 := pgjson.ParseISODate(b)
		if ok1 && ok2 {
			if x := cmp.Compare(da.Year, db.Year); x != 0 {
				return x
			}
			// The rest has a fixed layout: "MM", "DD", " HH:MM:SS", then
			// ".ffffff" when not 0 ('.' sorts after '+' and the end).
			if x := bytes.Compare(da.Month, db.Month); x != 0 {
				return x
			}
			if x := bytes.Compare(da.Day, db.Day); x != 0 {
				return x
			}
			return bytes.Compare(ra, rb)
		}
	}
	return bytes.Compare(a, b)
}

// numberRank places a number's text among the special values: -Infinity
// (-1) and the finite numbers (0) before Infinity (1) and NaN (2), as
// PostgreSQL sorts them.
func numberRank(s []byte) int {
	switch string(s) {
	case "-Infinity":
		return -1
	case "Infinity":
		return 1
	case "NaN":
		return 2
	}
	return 0
}

// infinityRank places a date's or timestamp's text: -infinity (-1), the
// finite ones (0), infinity (1).
func infinityRank(s []byte) int {
	switch string(s) {
	case "-infinity":
		return -1
	case "infinity":
		return 1
	}
	return 0
}

// memKeys lists the keys of every document of p in the state, in order.
func (s *memState) memKeys(p *docProjection) [][]byte {
	t := p.root.mem.t
	kc := t.colIdx[p.key.name]
	keys := make([][]byte, 0, t.n)
	for id := uint32(1); id < uint32(len(t.slots)); id++ {
		if row, ok := t.rowAt(id); ok {
			keys = append(keys, rowField(row, kc))
		}
	}
	slices.SortFunc(keys, func(a, b []byte) int { return compareText(p.key.ctype.OID, a, b) })
	return keys
}
