package gateway

import (
	"bufio"
	"errors"
	"sync"
	"syscall"
	"time"

	"github.com/fanwire/fanwire/gateway/internal/netconn"
)

// Parked readers: a connection whose client has nothing more to say has no
// goroutine at all. Every connection's reader used to wait in a blocked
// read, and a goroutine's stack (8 to 16 KiB once a subscribe has been
// handled) was the largest part of an idle connection's memory. Now a
// reader that has consumed all its client sent (nothing buffered) hands
// the socket to the node's idle poller and exits: one epoll set, watched
// by one goroutine, for every parked socket. When the socket becomes
// readable (a message, a pong, a close frame, an EOF) the poller starts a
// new reader, whose stack starts small again.
//
// Writes do not need the reader: the writer goroutine starts on demand
// (conn_writer.go). Pings do: the pong is read by whichever reader the
// poller starts for it. A connection the server closes (finish, a write
// error, a ping timeout, a forced shutdown) is woken by the closer
// (wakeReader), so its reader sees the closed socket and cleans up, as a
// running reader would have.
//
// Only plain TCP sockets park. A TLS connection's reader may hold
// decrypted bytes the socket no longer shows as readable, so it keeps its
// goroutine.

// pollerLinger is how long the poller goroutine waits with no parked
// socket before it exits (and closes its epoll set); the next park starts
// it again.
const pollerLinger = time.Second

// errParked is readLoop's return when the reader parked: the connection
// goes on without a reader goroutine.
var errParked = errors.New("reader parked")

// idlePoller watches parked sockets for readability.
type idlePoller struct {
	parkedGauge func(delta float64) // static: fanwire_readers_parked

	mu      sync.Mutex
	epfd    int              // guarded by mu: -1 while no poller runs
	wakeFD  int              // guarded by mu: eventfd that interrupts epoll_wait (stop)
	gen     uint64           // guarded by mu: counts epoll sets: a conn registered in an older one must ADD, not MOD
	nextID  uint64           // guarded by mu
	parked  map[uint64]*conn // guarded by mu: by the id in their epoll event
	stopped bool             // guarded by mu: Shutdown: no more parking
	wg      sync.WaitGroup   // the poller goroutine
}

// unpark removes c from the parked set, reporting whether it was there:
// then the caller owns its reading and must start a reader.
func (p *idlePoller) unpark(c *conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if c.park.id == 0 || p.parked[c.park.id] != c {
		return false
	}
	delete(p.parked, c.park.id)
	c.park.id = 0
	p.parkedGauge(-1)
	return true
}

// parking is a connection's share of parking: what the library reads from
// (parking needs it empty), the socket, and its place in the poller's
// set.
type parking struct {
	br     *bufio.Reader       // static: what the library reads from; parking needs it empty
	rc     syscall.RawConn     // static: the TCP socket; nil (TLS) never parks
	prefix *netconn.PrefixConn // static: not nil when frames came with the upgrade: no parking before they are read
	id     uint64              // guarded by s.idle.mu: its id in the poller's set; 0 while not parked
	gen    uint64              // guarded by s.idle.mu: the poller's epoll set it was last added to
	// gate orders a reader's look at br and the socket (parking,
	// skimming pongs) before the close handshake, which reads them too.
	gate    sync.Mutex
	closing bool // guarded by gate: the close handshake may read; no parking or skimming
}
