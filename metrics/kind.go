package metrics

import (
	"cmp"
	"slices"
)

// Kind is a pgoutput message's type byte, its first byte on the wire.
type Kind byte

// The pgoutput message kinds, as PostgreSQL's logicalproto.h defines them
// (LogicalRepMsgType). pglogrepl names the first fourteen; the two-phase
// kinds come with protocol version 3 (PostgreSQL 15).
const (
	KindBegin    Kind = 'B'
	KindCommit   Kind = 'C'
	KindOrigin   Kind = 'O'
	KindRelation Kind = 'R'
	KindType     Kind = 'Y'
	KindInsert   Kind = 'I'
	KindUpdate   Kind = 'U'
	KindDelete   Kind = 'D'
	KindTruncate Kind = 'T'
	KindMessage  Kind = 'M' // a logical decoding message (pg_logical_emit_message)

	// Streamed transactions (protocol version 2, PostgreSQL 14).
	KindStreamStart  Kind = 'S'
	KindStreamStop   Kind = 'E'
	KindStreamCommit Kind = 'c'
	KindStreamAbort  Kind = 'A'

	// Two-phase commit (protocol version 3, PostgreSQL 15).
	KindBeginPrepare     Kind = 'b'
	KindPrepare          Kind = 'P'
	KindCommitPrepared   Kind = 'K'
	KindRollbackPrepared Kind = 'r'
	KindStreamPrepare    Kind = 'p'
)

// kindUnknown is the label of every byte that is not a known kind.
const kindUnknown = "unknown"

// kindNames lists the known kinds with their label values. Slot i+1 of a WAL
// counts kindNames[i]; slot 0 counts every unknown byte.
var kindNames = [...]struct {
	kind Kind
	name string
}{
	{KindBegin, "begin"},
	{KindCommit, "commit"},
	{KindOrigin, "origin"},
	{KindRelation, "relation"},
	{KindType, "type"},
	{KindInsert, "insert"},
	{KindUpdate, "update"},
	{KindDelete, "delete"},
	{KindTruncate, "truncate"},
	{KindMessage, "message"},
	{KindStreamStart, "stream_start"},
	{KindStreamStop, "stream_stop"},
	{KindStreamCommit, "stream_commit"},
	{KindStreamAbort, "stream_abort"},
	{KindBeginPrepare, "begin_prepare"},
	{KindPrepare, "prepare"},
	{KindCommitPrepared, "commit_prepared"},
	{KindRollbackPrepared, "rollback_prepared"},
	{KindStreamPrepare, "stream_prepare"},
}

// numSlots is the number of kind rows in a WAL: the known kinds and unknown.
const numSlots = len(kindNames) + 1

// Tables built once by init and read-only after it, so any goroutine may read
// them without synchronisation.
var (
	// kindSlot maps a type byte to its row in WAL.counts; 0 = unknown. A
	// 256-entry table costs Observe one L1-hot byte load and keeps the counts
	// at 20×3 cells (480 B, 8 cache lines) instead of 256×3 (6 KiB).
	kindSlot [256]uint8
	// slotKind and slotName invert kindSlot.
	slotKind [numSlots]Kind
	slotName [numSlots]string
	// slotOrder lists the slots sorted by name, the order Snapshot reports.
	slotOrder [numSlots]uint8
)

func init() {
	slotName[0] = kindUnknown
	for i, k := range kindNames {
		slot := uint8(i + 1)
		kindSlot[k.kind] = slot
		slotKind[slot] = k.kind
		slotName[slot] = k.name
	}
	for i := range slotOrder {
		slotOrder[i] = uint8(i)
	}
	slices.SortFunc(slotOrder[:], func(a, b uint8) int { return cmp.Compare(slotName[a], slotName[b]) })
}

// String returns the kind's label value: "insert", "stream_start", …, or
// "unknown" for a byte that is not a pgoutput message type.
func (k Kind) String() string { return slotName[kindSlot[k]] }

// Known reports whether k is a pgoutput message type.
func (k Kind) Known() bool { return kindSlot[k] != 0 }

// KnownKinds returns every pgoutput message kind, in protocol order.
func KnownKinds() []Kind {
	ks := make([]Kind, len(kindNames))
	for i, k := range kindNames {
		ks[i] = k.kind
	}
	return ks
}
