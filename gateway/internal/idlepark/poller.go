package idlepark

import (
	"sync"
	"syscall"
	"time"
)

// pollerLinger is how long the poller goroutine waits with no parked
// socket before it exits (and closes its epoll set); the next park starts
// it again.
const pollerLinger = time.Second

// Conn is a connection that can park its reader.
type Conn interface {
	// Place is the connection's place with the poller.
	Place() *Place
	// Woken starts a reader: the socket is readable. It is the
	// connection's, and runs until it parks again or the connection ends.
	Woken()
	// ReadOn starts a reader that does not park: the poller is gone.
	ReadOn()
}

// Place is a connection's place with the poller: its socket, and where it
// is in the poller's set.
type Place struct {
	RC  syscall.RawConn // static: the TCP socket; nil (TLS) never parks
	id  uint64          // guarded by Poller.mu: its id in the poller's set; 0 while not parked
	gen uint64          // guarded by Poller.mu: the poller's epoll set it was last added to
}

// Poller watches parked sockets for readability.
type Poller struct {
	parkedGauge func(delta float64) // static: fanwire_readers_parked

	mu      sync.Mutex
	epfd    int             // guarded by mu: -1 while no poller runs
	wakeFD  int             // guarded by mu: eventfd that interrupts epoll_wait (stop)
	gen     uint64          // guarded by mu: counts epoll sets: a conn registered in an older one must ADD, not MOD
	nextID  uint64          // guarded by mu
	parked  map[uint64]Conn // guarded by mu: by the id in their epoll event
	stopped bool            // guarded by mu: Shutdown: no more parking
	wg      sync.WaitGroup  // the poller goroutine
}

// New is a poller that reports the parked count's changes to gauge
// (fanwire_readers_parked).
func New(gauge func(delta float64)) *Poller {
	return &Poller{epfd: -1, wakeFD: -1, parkedGauge: gauge}
}

// Unpark removes c from the parked set, reporting whether it was there:
// then the caller owns its reading and must start a reader.
func (p *Poller) Unpark(c Conn) bool {
	pl := c.Place()
	p.mu.Lock()
	defer p.mu.Unlock()
	if pl.id == 0 || p.parked[pl.id] != c {
		return false
	}
	delete(p.parked, pl.id)
	pl.id = 0
	p.parkedGauge(-1)
	return true
}
