package cdc

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
)

// spillFile holds the changes of one open transaction that outgrew
// Config.MaxTxnMemory: they are appended as they arrive, read back in
// order at its commit, and the file is removed after (or on abort, or
// when the reader ends). It is owned by the reader.
//
// A record is a held change (hold.go), prefixed with its length: flags
// (the message is a streamed one; a truncate), its xid, the generation of its table's
// definition, the generations of truncated tables, then the pgoutput
// message as received, undecoded. Read back, a change finds the table as
// it was when it arrived (relations.generations keeps them while a
// transaction is open), and its message is decoded as a held one is.
type spillFile struct {
	f       *os.File
	w       *bufio.Writer
	rec     []byte              // the record's header being encoded, reused
	lenBuf  []byte              // its length, encoded, reused
	size    int64               // bytes written
	aborted map[uint32]struct{} // rolled-back subtransactions (streamed transactions): their changes are skipped
}

// spillPrefix starts the names of a slot's spill files in the state
// directory; slot names hold no '-', so no other slot's files match.
func spillPrefix(slot string) string { return "spill-" + slot + "-" }

// newSpillFile creates a spill file for transaction xid under dir.
func newSpillFile(dir, slot string, xid uint32) (*spillFile, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("spill: %w", err)
	}
	f, err := os.CreateTemp(dir, spillPrefix(slot)+strconv.FormatUint(uint64(xid), 10)+"-*.tmp")
	if err != nil {
		return nil, fmt.Errorf("spill: %w", err)
	}
	return &spillFile{f: f, w: bufio.NewWriterSize(f, 64<<10)}, nil
}

// removeSpillFiles removes the spill files of slot left in dir by an
// ingest that did not end cleanly (a crash, SIGKILL) and returns how many.
func removeSpillFiles(dir, slot string) (int, error) {
	names, err := filepath.Glob(filepath.Join(dir, spillPrefix(slot)+"*.tmp"))
	if err != nil {
		return 0, fmt.Errorf("spill: %w", err)
	}
	var errs []error
	for _, n := range names {
		if err := os.Remove(n); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return len(names), fmt.Errorf("spill: remove files left by a previous run: %w", errors.Join(errs...))
	}
	return len(names), nil
}

// write appends h and returns the bytes it took.
func (s *spillFile) write(h *heldChange) (int, error) {
	b := s.rec[:0]
	var flags byte
	if h.stream {
		flags |= spillStream
	}
	if h.msg == nil {
		flags |= spillTruncate
	}
	b = append(b, flags)
	b = binary.AppendUvarint(b, uint64(h.xid))
	b = binary.AppendUvarint(b, h.tbl.generation())
	b = binary.AppendUvarint(b, uint64(len(h.truncs)))
	for _, t := range h.truncs {
		b = binary.AppendUvarint(b, t.generation())
	}
	// The record's length first: it is the header's (in s.rec, after the
	// length's room) and the message's, which is written as it is.
	l := binary.AppendUvarint(s.lenBuf[:0], uint64(len(b)+len(h.msg)))
	s.rec, s.lenBuf = b, l
	if _, err := s.w.Write(l); err != nil {
		return 0, fmt.Errorf("spill %s: %w", s.f.Name(), err)
	}
	if _, err := s.w.Write(b); err != nil {
		return 0, fmt.Errorf("spill %s: %w", s.f.Name(), err)
	}
	if _, err := s.w.Write(h.msg); err != nil {
		return 0, fmt.Errorf("spill %s: %w", s.f.Name(), err)
	}
	size := len(l) + len(b) + len(h.msg)
	s.size += int64(size)
	return size, nil
}

// abort drops the changes of rolled-back subtransaction xid: replay skips
// them (PostgreSQL sends no change of a subtransaction after its abort).
func (s *spillFile) abort(xid uint32) {
	if s.aborted == nil {
		s.aborted = make(map[uint32]struct{})
	}
	s.aborted[xid] = struct{}{}
}

// replay calls fn with each change written, in order, but those of
// aborted subtransactions; def gives a table definition by its generation.
// The change fn gets, and its message, are valid until fn returns: records
// are read into one buffer (and a record's header encoded into one: 2
// allocations per change less).
func (s *spillFile) replay(def func(uint64) *table, fn func(*heldChange) error) error {
	if err := s.w.Flush(); err != nil {
		return fmt.Errorf("spill %s: %w", s.f.Name(), err)
	}
	r := bufio.NewReaderSize(io.NewSectionReader(s.f, 0, s.size), 64<<10)
	var rec []byte
	var h heldChange // one for every record: fn is done with it when it returns
	for {
		n, err := binary.ReadUvarint(r)
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("spill %s: read: %w", s.f.Name(), err)
		}
		if n > uint64(s.size) {
			return fmt.Errorf("spill %s: a record of %d bytes in a file of %d", s.f.Name(), n, s.size)
		}
		if uint64(cap(rec)) < n {
			rec = make([]byte, n, max(n, 4<<10))
		}
		rec = rec[:n]
		if _, err := io.ReadFull(r, rec); err != nil {
			return fmt.Errorf("spill %s: read: %w", s.f.Name(), err)
		}
		h = heldChange{}
		if err := decodeHeld(rec, &h, def); err != nil {
			return fmt.Errorf("spill %s: %w", s.f.Name(), err)
		}
		if _, skip := s.aborted[h.xid]; skip {
			continue
		}
		if err := fn(&h); err != nil {
			return err
		}
	}
}

var errBadRecord = errors.New("malformed record")

// A record's flags.
const (
	spillStream   = 1 // the message is a streamed transaction's
	spillTruncate = 2 // a truncate: no message, the truncated tables
)

// decodeHeld decodes a record written by write into h (its message points
// into b); def gives a table definition by its generation.
func decodeHeld(b []byte, h *heldChange, def func(uint64) *table) error {
	d := decoder{b: b}
	flags := d.byte()
	h.stream = flags&spillStream != 0
	h.xid = uint32(d.uvarint())
	h.tbl = def(d.uvarint())
	if n := d.uvarint(); n > 0 && n <= uint64(len(d.b)) {
		h.truncs = make([]*table, n)
		for i := range h.truncs {
			h.truncs[i] = def(d.uvarint())
		}
	} else if n > 0 {
		d.err = true
	}
	truncate := flags&spillTruncate != 0
	if d.err || truncate != (len(d.b) == 0) {
		return errBadRecord
	}
	if !truncate {
		h.msg = d.b
	}
	return nil
}

// decoder reads a spill record, or a pgoutput change message
// (changeDecoder, with its uint16 and uint32); a read past its end sets
// err.
type decoder struct {
	b   []byte
	err bool
}

func (d *decoder) byte() byte {
	if len(d.b) == 0 {
		d.err = true
		return 0
	}
	v := d.b[0]
	d.b = d.b[1:]
	return v
}

func (d *decoder) uvarint() uint64 {
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.err = true
		return 0
	}
	d.b = d.b[n:]
	return v
}

// remove closes and removes the file; a nil file is none.
func (s *spillFile) remove() error {
	if s == nil {
		return nil
	}
	err := s.f.Close()
	if rerr := os.Remove(s.f.Name()); rerr != nil && err == nil {
		err = rerr
	}
	if err != nil {
		return fmt.Errorf("spill: %w", err)
	}
	return nil
}
