package cdc

import (
	"bytes"
	"cmp"
	"strconv"
	"strings"

	"github.com/jackc/pglogrepl"
)

// Event ids are deterministic: a transaction read again after a crash
// makes the same ids, and they order the ingest's events as it publishes
// them, so that the last one the broker stores (the high-water mark) tells
// which of the events read again are stored already (highwater.go). They
// do not depend on the configuration: a change's index counts every
// change of its transaction, published or not, and documents are ordered
// by their projection's name, so a restart with tables or projections
// added, removed or reordered finds the mark where it was.
//
// Every id starts with the ingest's writer name and ':' (writerName: the
// slot and the database system's identifier): ingests sharing a stream
// never share an id, and each finds its own mark among the others'
// events.
//
//   - A table event: "<commit LSN>-<index of its change in the
//     transaction>", and "-<W>" when a flush window of documents, opened
//     by the transaction committed at W, was open before this
//     transaction. A truncate of several tables takes an index per table.
//   - A document: "<L>-d<W>-<projection>-<key token>": L is the commit LSN of
//     the window's last transaction, W of its first; the key token is the
//     key as in the subject ("%truncate" for a projection's truncate
//     event). A window's documents are published after the table events of
//     its last transaction, projection by projection (by name), by key.
//   - A bootstrap row: "b-<hash>": the first 12 bytes (96 bits), in
//     hexadecimal, of the SHA-256 of the table's name and the row's values
//     in text format, each value's length before it and NULL apart from
//     the empty string (bootstrapHash). A row that did not change gets the
//     same id from a bootstrap started over; any change makes a new one
//     (two rows of a table collide with odds of about 2^-96 a pair). A
//     bootstrapped document: the same over "projection <name>", its key
//     and its JSON.
//
// LSNs are hexadecimal.

// eventPos is an event's place in the publish order, parsed from its id.
type eventPos struct {
	lsn    pglogrepl.LSN
	window pglogrepl.LSN // the open (table event) or its own (document) window's first commit; 0: none
	doc    bool
	i      int    // table event: index in the transaction
	proj   string // document: projection name
	key    []byte // document: the key's text; nil for a truncate event
}

func tableEventID(writer string, lsn pglogrepl.LSN, i int, window pglogrepl.LSN) string {
	id := writer + ":" + strconv.FormatUint(uint64(lsn), 16) + "-" + strconv.Itoa(i)
	if window != 0 {
		id += "-" + strconv.FormatUint(uint64(window), 16)
	}
	return id
}

// docEventID is a document's id; key nil: the projection's truncate event.
func docEventID(writer string, lsn, window pglogrepl.LSN, proj string, key []byte) string {
	tok := truncateToken
	if key != nil {
		tok = subjectToken(string(key))
	}
	return writer + ":" + strconv.FormatUint(uint64(lsn), 16) + "-d" + strconv.FormatUint(uint64(window), 16) + "-" + proj + "-" + tok
}

// docEventIDs returns docEventID for the documents of the window from
// window to lsn, formatting the part that one projection's ids share once.
// The function reuses its buffer: one goroutine calls it.
func docEventIDs(writer string, lsn, window pglogrepl.LSN) func(p *docProjection, key []byte) string {
	var proj *docProjection
	var prefix, buf []byte
	return func(p *docProjection, key []byte) string {
		if key == nil {
			return docEventID(writer, lsn, window, p.spec.Name, nil)
		}
		if p != proj {
			proj = p
			prefix = append(append(prefix[:0], writer...), ':')
			prefix = strconv.AppendUint(prefix, uint64(lsn), 16)
			prefix = append(prefix, "-d"...)
			prefix = strconv.AppendUint(prefix, uint64(window), 16)
			prefix = append(append(append(prefix, '-'), p.spec.Name...), '-')
		}
		buf = appendSubjectToken(append(buf[:0], prefix...), key)
		return string(buf)
	}
}

// parseEventID parses the id of a tail event of writer; ok is false for
// any other id (a bootstrap row's, another writer's, or one of another
// publisher).
func parseEventID(writer, id string) (p eventPos, ok bool) {
	id, mine := strings.CutPrefix(id, writer+":")
	if !mine {
		return p, false
	}
	parts := strings.SplitN(id, "-", 4)
	if len(parts) < 2 {
		return p, false
	}
	lsn, err := strconv.ParseUint(parts[0], 16, 64)
	if err != nil {
		return p, false
	}
	p.lsn = pglogrepl.LSN(lsn)
	if w, isDoc := strings.CutPrefix(parts[1], "d"); isDoc {
		win, err := strconv.ParseUint(w, 16, 64)
		if err != nil || len(parts) != 4 {
			return p, false
		}
		p.doc, p.window, p.proj = true, pglogrepl.LSN(win), parts[2]
		if parts[3] != truncateToken {
			key, ok := unescapeToken(parts[3])
			if !ok {
				return p, false
			}
			p.key = key
		}
		return p, true
	}
	if len(parts) > 3 {
		return p, false
	}
	if p.i, err = strconv.Atoi(parts[1]); err != nil || p.i < 0 {
		return p, false
	}
	if len(parts) == 3 {
		win, err := strconv.ParseUint(parts[2], 16, 64)
		if err != nil {
			return p, false
		}
		p.window = pglogrepl.LSN(win)
	}
	return p, true
}

// unescapeToken reverses subjectToken.
func unescapeToken(tok string) ([]byte, bool) {
	if tok == "%" {
		return []byte{}, true
	}
	out := make([]byte, 0, len(tok))
	for i := 0; i < len(tok); i++ {
		c := tok[i]
		if c != '%' {
			out = append(out, c)
			continue
		}
		if i+2 >= len(tok) {
			return nil, false
		}
		v, err := strconv.ParseUint(tok[i+1:i+3], 16, 8)
		if err != nil {
			return nil, false
		}
		out = append(out, byte(v))
		i += 2
	}
	return out, true
}

// compareEvents orders two positions as the ingest publishes them: by LSN;
// at one LSN the table events by index, then the documents, projection by
// projection (by name), a projection's truncate event before its
// documents, documents by key.
func compareEvents(a, b eventPos) int {
	if c := cmp.Compare(a.lsn, b.lsn); c != 0 {
		return c
	}
	switch {
	case !a.doc && !b.doc:
		return cmp.Compare(a.i, b.i)
	case !a.doc:
		return -1
	case !b.doc:
		return 1
	}
	if c := strings.Compare(a.proj, b.proj); c != 0 {
		return c
	}
	switch {
	case a.key == nil && b.key == nil:
		return 0
	case a.key == nil:
		return -1
	case b.key == nil:
		return 1
	}
	return bytes.Compare(a.key, b.key)
}
