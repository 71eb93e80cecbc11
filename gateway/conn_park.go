package gateway

import (
	"bufio"
	"errors"
	"sync"

	"github.com/fanwire/fanwire/gateway/internal/idlepark"
	"github.com/fanwire/fanwire/gateway/internal/netconn"
)

// Parked readers (package internal/idlepark): a reader that has consumed
// all its client sent hands the socket to the node's idle poller and
// exits; the poller starts a new reader (woken) when the socket is
// readable. Only plain TCP sockets park: a TLS connection's reader may
// hold decrypted bytes the socket no longer shows as readable.

// errParked is readLoop's return when the reader parked: the connection
// goes on without a reader goroutine.
var errParked = errors.New("reader parked")

// parking is a connection's share of parking: what the library reads from
// (parking needs it empty), the socket, and its place in the poller's
// set.
type parking struct {
	br     *bufio.Reader       // static: what the library reads from; parking needs it empty
	place  idlepark.Place      // its socket and its place in the poller's set
	prefix *netconn.PrefixConn // static: not nil when frames came with the upgrade: no parking before they are read
	// gate orders a reader's look at br and the socket (parking,
	// skimming pongs) before the close handshake, which reads them too.
	gate    sync.Mutex
	closing bool // guarded by gate: the close handshake may read; no parking or skimming
}

// Place is the connection's place with the idle poller (idlepark.Conn).
func (c *conn) Place() *idlepark.Place { return &c.park.place }

// ReadOn is a reader that does not park first (idlepark.Conn).
func (c *conn) ReadOn() { c.read(false) }
