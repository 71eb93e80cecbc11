package fanout

import (
	"testing"
	"unsafe"
)

// TestClientLayout guards the cache-line layout dispatch depends on: a
// client is exactly 128 bytes (so the allocator aligns it to 128) and its
// mailbox, whose pushed fields are its first 48 bytes
// (fanout.TestMailboxLayout), is its first field.
func TestClientLayout(t *testing.T) {
	if got := unsafe.Sizeof(Client{}); got != 128 {
		t.Errorf("client is %d bytes, want 128: adjust its padding", got)
	}
	if unsafe.Offsetof(Client{}.Mailbox) != 0 {
		t.Error("client.mb must be the first field")
	}
}
