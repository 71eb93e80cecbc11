package fanout

import (
	"errors"
	"fmt"
	"testing"
	"unsafe"
)

// testEvent returns an event item whose size() is exactly size bytes.
func testEvent(t testing.TB, size int) Item {
	t.Helper()
	subs := EncodeSubsList([]string{"s"})
	base, err := NewEvent("a", "", []byte(`""`))
	if err != nil {
		t.Fatal(err)
	}
	pad := size - len(base.buf) - len(subs.B)
	if pad < 0 {
		t.Fatalf("testEvent: %d bytes is below the minimum %d", size, len(base.buf)+len(subs.B))
	}
	data := make([]byte, pad+2)
	for i := range data {
		data[i] = 'x'
	}
	data[0], data[len(data)-1] = '"', '"'
	ev, err := NewEvent("a", "", data)
	if err != nil {
		t.Fatal(err)
	}
	it := Item{Ev: ev, Subs: subs}
	if it.Size() != size {
		t.Fatalf("testEvent: size %d, want %d", it.Size(), size)
	}
	return it
}

// drainBatch returns the batch's items in order and releases it.
func drainBatch(b Batch) []Item {
	defer b.Release()
	var out []Item
	for s := b.head; s != nil; s = b.Next(s) {
		out = append(out, b.Used(s)...)
	}
	return out
}

func TestMailboxItemBound(t *testing.T) {
	m := Mailbox{maxItems: 4, maxBytes: 1 << 20}
	it := testEvent(t, 100)
	for i := range 4 {
		wasEmpty, _, err := m.pushItem(it)
		if err != nil {
			t.Fatalf("push %d: %v", i, err)
		}
		if wasEmpty != (i == 0) {
			t.Errorf("push %d: wasEmpty = %v", i, wasEmpty)
		}
	}
	if _, _, err := m.pushItem(it); !errors.Is(err, ErrMailboxFull) {
		t.Fatalf("push over the item bound: %v, want ErrMailboxFull", err)
	}
	if _, err := m.PushControl(Item{Ev: NewControl(pong)}); !errors.Is(err, ErrMailboxFull) {
		t.Fatalf("pushControl over the item bound: %v, want ErrMailboxFull", err)
	}
	if m.Len() != 4 {
		t.Errorf("len = %d, want 4", m.Len())
	}
	if got := drainBatch(m.Take()); len(got) != 4 {
		t.Errorf("took %d items, want 4", len(got))
	}
	if wasEmpty, _, err := m.pushItem(it); err != nil || !wasEmpty {
		t.Errorf("push after take: wasEmpty=%v err=%v, want true, nil", wasEmpty, err)
	}
}

func TestMailboxByteBound(t *testing.T) {
	m := Mailbox{maxItems: 100, maxBytes: 1000}
	it := testEvent(t, 300)
	for i := range 3 {
		if _, _, err := m.pushItem(it); err != nil {
			t.Fatalf("push %d: %v", i, err)
		}
	}
	if _, _, err := m.pushItem(it); !errors.Is(err, ErrMailboxFull) { // 1200 > 1000
		t.Fatalf("push over the byte bound: %v, want ErrMailboxFull", err)
	}
	if _, _, err := m.pushItem(testEvent(t, 100)); err != nil { // exactly 1000 fits
		t.Fatalf("push up to exactly the byte bound: %v", err)
	}
	if _, _, err := m.pushItem(testEvent(t, 62)); !errors.Is(err, ErrMailboxFull) {
		t.Fatalf("push of one byte over: %v, want ErrMailboxFull", err)
	}
	if m.Len() != 4 {
		t.Errorf("len = %d, want 4", m.Len())
	}

	// A single item larger than the byte bound never fits, even empty.
	big := Mailbox{maxItems: 100, maxBytes: 200}
	if _, _, err := big.pushItem(it); !errors.Is(err, ErrMailboxFull) {
		t.Errorf("push of an item over the whole byte bound: %v, want ErrMailboxFull", err)
	}
}

// TestMailboxPushControl: replies count against both bounds, as events do
// (they once could exceed the byte bound: a client asking for members
// without reading held a reply per request).
func TestMailboxPushControl(t *testing.T) {
	m := Mailbox{maxItems: 3, maxBytes: 200}
	ev := testEvent(t, 150)
	if _, _, err := m.pushItem(ev); err != nil {
		t.Fatal(err)
	}
	// A reply that would take the mailbox over its byte bound is refused ...
	if _, err := m.PushControl(Item{Ev: NewControl(make([]byte, 51))}); !errors.Is(err, ErrMailboxFull) {
		t.Fatalf("pushControl over the byte bound: %v, want ErrMailboxFull", err)
	}
	// ... one up to it fits, and its bytes count against later events.
	ctl := Item{Ev: NewControl(make([]byte, 25))}
	wasEmpty, err := m.PushControl(ctl)
	if err != nil || wasEmpty {
		t.Fatalf("pushControl within the byte bound: wasEmpty=%v err=%v, want false, nil", wasEmpty, err)
	}
	if m.Free() != 25 {
		t.Errorf("free = %d after 175 of 200 bytes, want 25", m.Free())
	}
	if _, _, err := m.pushItem(testEvent(t, 62)); !errors.Is(err, ErrMailboxFull) {
		t.Errorf("push of an event over what the reply left: %v, want ErrMailboxFull", err)
	}
	if _, err := m.PushControl(ctl); err != nil {
		t.Errorf("second pushControl, exactly up to the byte bound: %v", err)
	}
	if _, err := m.PushControl(Item{Ev: NewControl(pong[:0])}); !errors.Is(err, ErrMailboxFull) {
		t.Errorf("pushControl over the item bound: %v, want ErrMailboxFull", err)
	}
	got := drainBatch(m.Take())
	if len(got) != 3 || got[0].Subs == nil || got[1].Subs != nil || got[2].Subs != nil {
		t.Errorf("took %d items, want the event then two replies", len(got))
	}
	// On an empty mailbox, pushControl reports it was empty.
	if wasEmpty, err := m.PushControl(ctl); err != nil || !wasEmpty {
		t.Errorf("pushControl on empty: wasEmpty=%v err=%v", wasEmpty, err)
	}
}

func TestMailboxOverHalf(t *testing.T) {
	tests := []struct {
		name      string
		maxItems  int32
		maxBytes  int
		items     int
		size      int
		pressured bool
	}{
		{"empty", 10, 10000, 0, 100, false},
		{"half the items", 10, 10000, 5, 100, false},
		{"over half the items", 10, 10000, 6, 100, true},
		{"half the bytes", 100, 1000, 5, 100, false},
		{"over half the bytes", 100, 1000, 3, 200, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := Mailbox{maxItems: tt.maxItems, maxBytes: tt.maxBytes}
			it := testEvent(t, tt.size)
			var pressured bool
			for i := range tt.items {
				_, p, err := m.pushItem(it)
				if err != nil {
					t.Fatalf("push %d: %v", i, err)
				}
				pressured = p
			}
			if m.OverHalf() != tt.pressured {
				t.Errorf("overHalf = %v, want %v", m.OverHalf(), tt.pressured)
			}
			if tt.items > 0 && pressured != tt.pressured {
				t.Errorf("push reported pressured = %v, want %v", pressured, tt.pressured)
			}
			drainBatch(m.Take())
			if m.OverHalf() {
				t.Error("overHalf after take")
			}
		})
	}
}

// TestMailboxTakeOrder queues across several segments and checks that take
// returns every item in order and leaves the mailbox empty.
func TestMailboxTakeOrder(t *testing.T) {
	m := Mailbox{maxItems: 10000, maxBytes: 1 << 30}
	for _, n := range []int{0, 1, SegmentItems - 1, SegmentItems, SegmentItems + 1, 3*SegmentItems + 5} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			var want []*Event
			for i := range n {
				ev, err := NewEvent("a", "", []byte(fmt.Sprint(i)))
				if err != nil {
					t.Fatal(err)
				}
				want = append(want, ev)
				if _, _, err := m.pushItem(Item{Ev: ev, Subs: EncodeSubsList(nil)}); err != nil {
					t.Fatal(err)
				}
			}
			b := m.Take()
			if b.n != n {
				t.Errorf("batch.n = %d, want %d", b.n, n)
			}
			if m.Len() != 0 || m.OverHalf() {
				t.Errorf("mailbox not empty after take: len %d", m.Len())
			}
			got := drainBatch(b)
			if len(got) != n {
				t.Fatalf("took %d items, want %d", len(got), n)
			}
			for i, it := range got {
				if it.Ev != want[i] {
					t.Fatalf("item %d out of order", i)
				}
			}
		})
	}
}

// TestMailboxRecycling: a released batch's segments are cleared (they must
// not pin events while pooled) and unlinked, and the mailbox keeps working
// across take/release cycles while new pushes land in fresh segments that
// the writer's batch does not share.
func TestMailboxRecycling(t *testing.T) {
	m := Mailbox{maxItems: 10000, maxBytes: 1 << 30}
	it := testEvent(t, 100)
	for range 2*SegmentItems + 3 {
		if _, _, err := m.pushItem(it); err != nil {
			t.Fatal(err)
		}
	}
	b := m.Take()
	var segs []*Segment
	for s := b.head; s != nil; s = b.Next(s) {
		segs = append(segs, s)
	}
	if len(segs) != 3 {
		t.Fatalf("%d segments for %d items, want 3", len(segs), 2*SegmentItems+3)
	}
	// Pushes while the writer holds the batch go to a new segment.
	if wasEmpty, _, err := m.pushItem(it); err != nil || !wasEmpty {
		t.Fatalf("push during a held batch: wasEmpty=%v err=%v", wasEmpty, err)
	}
	for _, s := range segs {
		if s == m.head || s == m.tail {
			t.Fatal("the mailbox reuses a segment the writer still holds")
		}
	}
	if got := len(drainBatch(b)); got != 2*SegmentItems+3 {
		t.Errorf("batch grew to %d items after the take", got)
	}
	for i, s := range segs {
		if s.next != nil {
			t.Errorf("segment %d still linked after release", i)
		}
		for j := range s.items {
			if s.items[j] != (Item{}) {
				t.Fatalf("segment %d item %d not cleared after release", i, j)
			}
		}
	}
	if got := drainBatch(m.Take()); len(got) != 1 || got[0] != it {
		t.Errorf("second take: %d items", len(got))
	}
	// Many cycles, each crossing segment boundaries, stay in order.
	for cycle := range 20 {
		n := cycle * 37
		for i := range n {
			ev := &Event{Subject: fmt.Sprint(i), buf: []byte("{}"), split: -1}
			if _, err := m.PushControl(Item{Ev: ev}); err != nil {
				t.Fatal(err)
			}
		}
		got := drainBatch(m.Take())
		if len(got) != n {
			t.Fatalf("cycle %d: took %d items, want %d", cycle, len(got), n)
		}
		for i, it := range got {
			if it.Ev.Subject != fmt.Sprint(i) {
				t.Fatalf("cycle %d: item %d is %q", cycle, i, it.Ev.Subject)
			}
		}
	}
	// An empty take is an empty batch; releasing it is harmless.
	e := m.Take()
	if e.n != 0 || e.head != nil {
		t.Errorf("empty take: %+v", e)
	}
	e.Release()
}

func TestMailboxClose(t *testing.T) {
	m := Mailbox{maxItems: 10, maxBytes: 1 << 20}
	it := testEvent(t, 100)
	for range 3 {
		if _, _, err := m.pushItem(it); err != nil {
			t.Fatal(err)
		}
	}
	m.Close()
	if m.Len() != 0 {
		t.Errorf("len = %d after close, want 0 (queued items dropped)", m.Len())
	}
	if _, _, err := m.pushItem(it); !errors.Is(err, ErrMailboxFull) {
		t.Errorf("push after close: %v, want ErrMailboxFull", err)
	}
	if _, err := m.PushControl(Item{Ev: NewControl(pong)}); !errors.Is(err, ErrMailboxFull) {
		t.Errorf("pushControl after close: %v, want ErrMailboxFull", err)
	}
	if b := m.Take(); b.n != 0 || b.head != nil {
		t.Errorf("take after close returned %d items", b.n)
	}
	if m.OverHalf() {
		t.Error("overHalf after close")
	}
	m.Close() // idempotent
}

// TestMailboxCloseWhileWriterHoldsBatch: close drops what is queued but
// leaves a batch the writer already took intact.
func TestMailboxCloseWhileWriterHoldsBatch(t *testing.T) {
	m := Mailbox{maxItems: 1000, maxBytes: 1 << 20}
	it := testEvent(t, 100)
	for range SegmentItems + 1 {
		m.pushItem(it)
	}
	b := m.Take()
	m.pushItem(it)
	m.Close()
	if got := drainBatch(b); len(got) != SegmentItems+1 || got[0] != it || got[SegmentItems] != it {
		t.Errorf("held batch has %d items after close, want %d", len(got), SegmentItems+1)
	}
}

// TestMailboxLayout guards the cache-line layout dispatch depends on:
// every field a push touches is in the mailbox's first 48 bytes (the
// gateway's client puts the mailbox first, on a 128-byte boundary).
func TestMailboxLayout(t *testing.T) {
	if end := unsafe.Offsetof(Mailbox{}.closed); end >= 48 {
		t.Errorf("mailbox.closed at offset %d: push's fields must stay in the first 48 bytes", end)
	}
}

// TestSegmentSizeClass: a segment fills its malloc size class (2,048 bytes)
// with no room left for another item: 128 items and the link were 2,056
// bytes, which the allocator rounds up to 2,304.
func TestSegmentSizeClass(t *testing.T) {
	const class = 2048
	size := unsafe.Sizeof(Segment{})
	if size > class || size+unsafe.Sizeof(Item{}) <= class {
		t.Errorf("segment is %d bytes (%d items of %d): want the most items that fit in %d", size, SegmentItems, unsafe.Sizeof(Item{}), class)
	}
}

// pushItem pushes it with its computed size, as the hub does with a cached one.
func (m *Mailbox) pushItem(it Item) (wasEmpty, pressured bool, err error) {
	wasEmpty, fill, err := m.Push(it, it.Size())
	return wasEmpty, fill >= FillHalf, err
}

var pong = []byte(`{"type":"pong"}`)
