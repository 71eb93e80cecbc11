package cdc

import (
	"testing"

	"github.com/jackc/pglogrepl"
)

// TestEventIDsOrderAsPublished: ids parse back to their positions, and
// ordered by compareEvents they are in the order the ingest publishes
// them: by LSN; at one LSN table events, then documents by projection
// name (its truncate event first) and key. Keys with separators, '%' and the
// empty key survive the id.
func TestEventIDsOrderAsPublished(t *testing.T) {
	t.Parallel()
	published := []string{
		tableEventID("w", 0x16b3748, 0, 0),
		tableEventID("w", 0x16b3748, 1, 0),
		tableEventID("w", 0x16b3748, 10, 0),
		tableEventID("w", 0x16b3800, 0, 0x16b3800),
		tableEventID("w", 0x16b3900, 0, 0x16b3800),
		docEventID("w", 0x16b3900, 0x16b3800, "customers", []byte("1")),
		docEventID("w", 0x16b3900, 0x16b3800, "orders", nil),
		docEventID("w", 0x16b3900, 0x16b3800, "orders", []byte("")),
		docEventID("w", 0x16b3900, 0x16b3800, "orders", []byte("%")),
		docEventID("w", 0x16b3900, 0x16b3800, "orders", []byte("10")),
		docEventID("w", 0x16b3900, 0x16b3800, "orders", []byte("9")),
		docEventID("w", 0x16b3900, 0x16b3800, "orders", []byte("a-b.c,d")),
		tableEventID("w", 0x1_0000_0000, 0, 0),
	}
	var prev eventPos
	for i, id := range published {
		pos, ok := parseEventID("w", id)
		if !ok {
			t.Fatalf("%q does not parse", id)
		}
		if i > 0 && compareEvents(prev, pos) >= 0 {
			t.Errorf("%q is not after %q", id, published[i-1])
		}
		if compareEvents(pos, pos) != 0 {
			t.Errorf("%q is not equal to itself", id)
		}
		prev = pos
	}
	pos, _ := parseEventID("w", docEventID("w", 1, 2, "orders", []byte("a-b.c,d%")))
	if string(pos.key) != "a-b.c,d%" || pos.window != 2 || pos.lsn != pglogrepl.LSN(1) || pos.proj != "orders" {
		t.Errorf("parsed %+v", pos)
	}
	for _, id := range []string{"", "w:b-0123456789abcdef01234567", "w:x-1", "w:16b3748", "w:16b3748-x", "w:16b3748-1-2-3", "w:16b3748-dzz-orders-1", "w:16b3748-d1-orders-%zz", "w:16b3748-d1-orders",
		"16b3748-0", "v:16b3748-0", "ww:16b3748-0"} { // another writer's
		if _, ok := parseEventID("w", id); ok {
			t.Errorf("%q parses as a change's id", id)
		}
	}
}

// The byte-appending forms write what the string forms write.
func TestAppendFormsAgree(t *testing.T) {
	t.Parallel()
	for _, lsn := range []pglogrepl.LSN{0, 1, 0xabcdef, 0x1_0000_0000, 0xFFFF_FFFF_FFFF_FFFF, 0x16_B374_D848} {
		if got, want := string(appendLSN([]byte("x"), lsn)), "x"+lsn.String(); got != want {
			t.Errorf("appendLSN(%d) = %q, want %q", uint64(lsn), got, want)
		}
	}
	p1 := &docProjection{spec: &ProjectionSpec{Name: "orders"}}
	p2 := &docProjection{spec: &ProjectionSpec{Name: "users"}}
	ids := docEventIDs("w", 0x16B374D848, 0x16B374D000)
	for _, k := range []string{"", "1", "abc-DEF_9", "a.b", "é ü", "*>", "%", "\x00\xff"} {
		if got, want := string(appendSubjectToken([]byte("s."), []byte(k))), "s."+subjectToken(k); got != want {
			t.Errorf("appendSubjectToken(%q) = %q, want %q", k, got, want)
		}
		for _, p := range []*docProjection{p1, p2, p1} {
			if got, want := ids(p, []byte(k)), docEventID("w", 0x16B374D848, 0x16B374D000, p.spec.Name, []byte(k)); got != want {
				t.Errorf("docEventIDs(%s, %q) = %q, want %q", p.spec.Name, k, got, want)
			}
		}
	}
	if got, want := ids(p1, nil), docEventID("w", 0x16B374D848, 0x16B374D000, "orders", nil); got != want {
		t.Errorf("docEventIDs(truncate) = %q, want %q", got, want)
	}
}
