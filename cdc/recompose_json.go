package cdc

import (
	"fmt"
	"strconv"
	"time"

	"github.com/fanwire/fanwire/broker"
	"github.com/jackc/pglogrepl"
)

// Documents as JSON: a document re-read by the sql mode (appendDoc; the
// memory mode writes its own from the state, memory_compose.go), and the
// event that carries a document (docEvent).

// appendDoc appends row r of node n as a JSON object with its embeds.
func appendDoc(b []byte, n *docNode, r *composedRow) ([]byte, error) {
	b = append(b, '{')
	var err error
	for i, c := range n.cols {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, c.jsonName...)
		if r.vals[i] == nil {
			b = append(b, "null"...)
			continue
		}
		if b, err = c.ctype.Append(b, r.vals[i]); err != nil {
			return nil, fmt.Errorf("projection %q, %s column %s: %w", n.proj.spec.Name, n.nameKey, c.name, err)
		}
	}
	for ci, child := range n.children {
		if len(n.cols) > 0 || ci > 0 {
			b = append(b, ',')
		}
		b = append(b, child.as...)
		kids := r.children[ci]
		if child.many {
			b = append(b, '[')
			for k, kr := range kids {
				if k > 0 {
					b = append(b, ',')
				}
				if b, err = appendDoc(b, child, kr); err != nil {
					return nil, err
				}
			}
			b = append(b, ']')
			continue
		}
		if len(kids) == 0 {
			b = append(b, "null"...)
			continue
		}
		if b, err = appendDoc(b, child, kids[0]); err != nil {
			return nil, err
		}
	}
	return append(b, '}'), nil
}

// docEvent is a document's event: upsert with the document, or delete. A
// document that could not be encoded (docErr), whose key cannot be, or
// whose event is over the broker's limit becomes its error event, reported
// (counted and logged) here.
func (e *docEngine) docEvent(p *docProjection, key, doc []byte, docErr error, id string, lsn pglogrepl.LSN, commitTime time.Time) broker.Outgoing {
	ev, keyJSON, err := encodeDocEvent(p, key, doc, id, lsn, commitTime)
	reason := badValue
	switch {
	case err != nil:
		err = fmt.Errorf("key: %w", err)
	case docErr != nil:
		err = docErr
	default:
		if err = sizeError(ev, e.maxEvent); err == nil {
			return ev
		}
		reason = badTooLarge
	}
	bad := &badRowError{reason: reason, source: "projection " + p.spec.Name, key: string(key), lsn: lsn, err: err}
	e.report(bad)
	return errorEvent(p.errSubject, bad, keyJSON, id, commitTime)
}

// encodeDocEvent builds a document's event, and returns its key as JSON
// (nil when the key cannot be encoded: the error says why).
func encodeDocEvent(p *docProjection, key, doc []byte, id string, lsn pglogrepl.LSN, commitTime time.Time) (_ broker.Outgoing, keyJSON []byte, _ error) {
	b := make([]byte, 0, 128+len(doc))
	b = append(b, `{"id":"`...)
	b = append(b, id...)
	if doc == nil {
		b = append(b, `","op":"delete","key":`...)
	} else {
		b = append(b, `","op":"upsert","key":`...)
	}
	start := len(b)
	b, err := p.key.ctype.Append(b, key)
	if err != nil {
		return broker.Outgoing{}, nil, err
	}
	keyJSON = b[start:len(b):len(b)]
	b = append(b, `,"lsn":"`...)
	b = appendLSN(b, lsn)
	b = append(b, `","commit_time":"`...)
	b = commitTime.UTC().AppendFormat(b, time.RFC3339Nano)
	b = append(b, `","doc":`...)
	if doc == nil {
		b = append(b, "null"...)
	} else {
		b = append(b, doc...)
	}
	b = append(b, '}')
	var sb [128]byte
	subject := appendSubjectToken(append(append(sb[:0], p.subject...), '.'), key)
	return broker.Outgoing{Subject: string(subject), Data: b, ID: id}, keyJSON, nil
}

// appendLSN appends lsn as lsn.String() writes it ("%X/%X").
func appendLSN(b []byte, lsn pglogrepl.LSN) []byte {
	b = appendUpperHex(b, uint64(lsn>>32))
	b = append(b, '/')
	return appendUpperHex(b, uint64(uint32(lsn)))
}

// appendUpperHex appends v in hexadecimal, with upper-case digits.
func appendUpperHex(b []byte, v uint64) []byte {
	start := len(b)
	b = strconv.AppendUint(b, v, 16)
	for i := start; i < len(b); i++ {
		if b[i] >= 'a' {
			b[i] -= 'a' - 'A'
		}
	}
	return b
}
