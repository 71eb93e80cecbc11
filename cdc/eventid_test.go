package cdc

import (
	"testing"

	"github.com/jackc/pglogrepl"
)

// TestEventIDsOrderAsPublished: ids parse back to their positions, and
// ordered by compareEvents they are in the order the ingest publishes
// them: by LSN; at one LSN table events, then documents by projection
// (its truncate event first) and key. Keys with separators, '%' and the
// empty key survive the id.
func TestEventIDsOrderAsPublished(t *testing.T) {
	projs := []string{"orders", "customers"}
	index := func(name string) int {
		for i, p := range projs {
			if p == name {
				return i
			}
		}
		return -1
	}
	published := []string{
		tableEventID(0x16b3748, 0, 0),
		tableEventID(0x16b3748, 1, 0),
		tableEventID(0x16b3748, 10, 0),
		tableEventID(0x16b3800, 0, 0x16b3800),
		tableEventID(0x16b3900, 0, 0x16b3800),
		docEventID(0x16b3900, 0x16b3800, "orders", nil),
		docEventID(0x16b3900, 0x16b3800, "orders", []byte("")),
		docEventID(0x16b3900, 0x16b3800, "orders", []byte("%")),
		docEventID(0x16b3900, 0x16b3800, "orders", []byte("10")),
		docEventID(0x16b3900, 0x16b3800, "orders", []byte("9")),
		docEventID(0x16b3900, 0x16b3800, "orders", []byte("a-b.c,d")),
		docEventID(0x16b3900, 0x16b3800, "customers", []byte("1")),
		tableEventID(0x1_0000_0000, 0, 0),
	}
	var prev eventPos
	for i, id := range published {
		pos, ok := parseEventID(id)
		if !ok {
			t.Fatalf("%q does not parse", id)
		}
		if i > 0 && compareEvents(prev, pos, index) >= 0 {
			t.Errorf("%q is not after %q", id, published[i-1])
		}
		if compareEvents(pos, pos, index) != 0 {
			t.Errorf("%q is not equal to itself", id)
		}
		prev = pos
	}
	pos, _ := parseEventID(docEventID(1, 2, "orders", []byte("a-b.c,d%")))
	if string(pos.key) != "a-b.c,d%" || pos.window != 2 || pos.lsn != pglogrepl.LSN(1) || pos.proj != "orders" {
		t.Errorf("parsed %+v", pos)
	}
	for _, id := range []string{"", "b-0123456789abcdef01234567", "x-1", "16b3748", "16b3748-x", "16b3748-1-2-3", "16b3748-dzz-orders-1", "16b3748-d1-orders-%zz", "16b3748-d1-orders"} {
		if _, ok := parseEventID(id); ok {
			t.Errorf("%q parses as a change's id", id)
		}
	}
}

// The byte-appending forms write what the string forms write.
func TestAppendFormsAgree(t *testing.T) {
	for _, lsn := range []pglogrepl.LSN{0, 1, 0xabcdef, 0x1_0000_0000, 0xFFFF_FFFF_FFFF_FFFF, 0x16_B374_D848} {
		if got, want := string(appendLSN([]byte("x"), lsn)), "x"+lsn.String(); got != want {
			t.Errorf("appendLSN(%d) = %q, want %q", uint64(lsn), got, want)
		}
	}
	p1 := &docProjection{spec: &ProjectionSpec{Name: "orders"}}
	p2 := &docProjection{spec: &ProjectionSpec{Name: "users"}}
	ids := docEventIDs(0x16B374D848, 0x16B374D000)
	for _, k := range []string{"", "1", "abc-DEF_9", "a.b", "é ü", "*>", "%", "\x00\xff"} {
		if got, want := string(appendSubjectToken([]byte("s."), []byte(k))), "s."+subjectToken(k); got != want {
			t.Errorf("appendSubjectToken(%q) = %q, want %q", k, got, want)
		}
		for _, p := range []*docProjection{p1, p2, p1} {
			if got, want := ids(p, []byte(k)), docEventID(0x16B374D848, 0x16B374D000, p.spec.Name, []byte(k)); got != want {
				t.Errorf("docEventIDs(%s, %q) = %q, want %q", p.spec.Name, k, got, want)
			}
		}
	}
	if got, want := ids(p1, nil), docEventID(0x16B374D848, 0x16B374D000, "orders", nil); got != want {
		t.Errorf("docEventIDs(truncate) = %q, want %q", got, want)
	}
}
