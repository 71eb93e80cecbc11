package cdc

import (
	"net"
	"runtime"
	"testing"
	"time"

	"github.com/fanwire/fanwire/broker/brokertest"
)

// TestPacerSeesWhatWaits: the pacer reads how many bytes a TCP connection
// holds unread (what decides whether a big transaction's next read waits),
// and a connection it cannot ask says so (-1) instead of pacing.
func TestPacerSeesWhatWaits(t *testing.T) {
	t.Parallel()
	server, client := brokertest.TCPPair(t)
	p := newPacer(client)
	if runtime.GOOS != "linux" {
		if got := p.pending(); got != -1 {
			t.Fatalf("pending %d off Linux, want -1", got)
		}
		return
	}
	if got := p.pending(); got != 0 {
		t.Fatalf("pending %d before anything was sent, want 0", got)
	}
	if _, err := server.Write(make([]byte, 3000)); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for p.pending() != 3000 {
		if time.Now().After(deadline) {
			t.Fatalf("pending %d, want the 3000 bytes sent", p.pending())
		}
		runtime.Gosched()
	}
	if _, err := client.Read(make([]byte, 1000)); err != nil {
		t.Fatal(err)
	}
	if got := p.pending(); got != 2000 {
		t.Fatalf("pending %d after reading 1000, want 2000", got)
	}
	a, b := net.Pipe() // no socket under it
	defer a.Close()
	defer b.Close()
	if got := newPacer(a).pending(); got != -1 {
		t.Fatalf("pending %d on a net.Pipe, want -1", got)
	}
}
