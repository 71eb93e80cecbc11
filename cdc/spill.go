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

	"github.com/jackc/pglogrepl"
)

// spillFile holds the changes of one open transaction that outgrew
// Config.MaxTxnMemory: they are appended as they arrive, read back in
// order at its commit, and the file is removed after (or on abort, or
// when the reader ends). It is owned by the reader.
//
// A record is a change (kind, xid, relation, the generation of its table's
// definition, old tuple kind, its tuples' columns with their data types,
// the generations of truncated tables), prefixed with its length: read
// back, a change finds the table as it was when it arrived
// (relations.generations keeps them while a transaction is open). Read back, each change gets a buffer of its own, which its
// tuples point into, as a change received from the WAL does.
type spillFile struct {
	f       *os.File
	w       *bufio.Writer
	rec     []byte              // the record being encoded, reused
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

// write appends c and returns the bytes it took.
func (s *spillFile) write(c *change) (int, error) {
	b := s.rec[:0]
	b = append(b, c.kind, c.oldKind)
	b = binary.AppendUvarint(b, uint64(c.xid))
	b = binary.AppendUvarint(b, uint64(c.rel))
	b = binary.AppendUvarint(b, c.tbl.generation())
	b = appendTuple(b, c.newRow)
	b = appendTuple(b, c.oldRow)
	b = binary.AppendUvarint(b, uint64(len(c.truncs)))
	for _, t := range c.truncs {
		b = binary.AppendUvarint(b, t.generation())
	}
	s.rec = b
	var l [binary.MaxVarintLen64]byte
	n := binary.PutUvarint(l[:], uint64(len(b)))
	if _, err := s.w.Write(l[:n]); err != nil {
		return 0, fmt.Errorf("spill %s: %w", s.f.Name(), err)
	}
	if _, err := s.w.Write(b); err != nil {
		return 0, fmt.Errorf("spill %s: %w", s.f.Name(), err)
	}
	s.size += int64(n + len(b))
	return n + len(b), nil
}

// appendTuple appends a tuple: its column count plus one (0: none), then
// each column's data type and, for a value, its length and bytes.
func appendTuple(b []byte, t *pglogrepl.TupleData) []byte {
	if t == nil {
		return append(b, 0)
	}
	b = binary.AppendUvarint(b, uint64(len(t.Columns))+1)
	for _, col := range t.Columns {
		b = append(b, col.DataType)
		if col.DataType == pglogrepl.TupleDataTypeText || col.DataType == pglogrepl.TupleDataTypeBinary {
			b = binary.AppendUvarint(b, uint64(len(col.Data)))
			b = append(b, col.Data...)
		}
	}
	return b
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
func (s *spillFile) replay(def func(uint64) *table, fn func(*change) error) error {
	if err := s.w.Flush(); err != nil {
		return fmt.Errorf("spill %s: %w", s.f.Name(), err)
	}
	r := bufio.NewReaderSize(io.NewSectionReader(s.f, 0, s.size), 64<<10)
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
		rec := make([]byte, n) // the change's own: its tuples point into it
		if _, err := io.ReadFull(r, rec); err != nil {
			return fmt.Errorf("spill %s: read: %w", s.f.Name(), err)
		}
		var c change
		if err := decodeChange(rec, &c, def); err != nil {
			return fmt.Errorf("spill %s: %w", s.f.Name(), err)
		}
		if _, skip := s.aborted[c.xid]; skip {
			continue
		}
		if err := fn(&c); err != nil {
			return err
		}
	}
}

var errBadRecord = errors.New("malformed record")

// decodeChange decodes a record written by write into c; def gives a
// table definition by its generation.
func decodeChange(b []byte, c *change, def func(uint64) *table) error {
	d := decoder{b: b}
	c.kind, c.oldKind = d.byte(), d.byte()
	c.xid, c.rel = uint32(d.uvarint()), uint32(d.uvarint())
	c.tbl = def(d.uvarint())
	c.newRow, c.oldRow = d.tuple(), d.tuple()
	if n := d.uvarint(); n > 0 && n <= uint64(len(d.b)) {
		c.truncs = make([]*table, n)
		for i := range c.truncs {
			c.truncs[i] = def(d.uvarint())
		}
	} else if n > 0 {
		d.err = true
	}
	if d.err || len(d.b) != 0 {
		return errBadRecord
	}
	return nil
}

// decoder reads a spill record, or a pgoutput change message
// (parseChange, with its uint16, uint32 and pgTuple); a read past its end
// sets err.
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

func (d *decoder) tuple() *pglogrepl.TupleData {
	n := d.uvarint()
	if n == 0 || d.err {
		return nil
	}
	n--
	if n > uint64(len(d.b)) || n >= 1<<16 { // a column takes a byte at least
		d.err = true
		return nil
	}
	if n == 0 {
		return &pglogrepl.TupleData{}
	}
	cols := make([]pglogrepl.TupleDataColumn, n)
	t := &pglogrepl.TupleData{ColumnNum: uint16(n), Columns: make([]*pglogrepl.TupleDataColumn, n)}
	for i := range cols {
		col := &cols[i]
		col.DataType = d.byte()
		if col.DataType == pglogrepl.TupleDataTypeText || col.DataType == pglogrepl.TupleDataTypeBinary {
			l := d.uvarint()
			if l > uint64(len(d.b)) {
				d.err = true
				return nil
			}
			col.Length, col.Data = uint32(l), d.b[:l:l]
			d.b = d.b[l:]
		}
		t.Columns[i] = col
	}
	return t
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
