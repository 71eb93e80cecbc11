package gateway_test

import (
	"net"
	"sync"
	"testing"

	"github.com/fanwire/fanwire/broker/brokertest"
	"github.com/fanwire/fanwire/gateway"
)

// writeGate holds up the gateway's writes to one client's socket: a client
// that reads nothing, for certain. (A client that merely does not read
// stalls its socket only once the kernel's buffers are full, and how much
// they absorb first depends on the kernel's autotuning.) Every other
// connection, the inspector's HTTP requests among them, is served as
// usual.
type writeGate struct {
	mu      sync.Mutex
	changed *sync.Cond
	held    string // the held client's address, as the server sees it ("": none)
	waiting int    // writes waiting at the gate
}

// newEnvGated is newEnvOn with a write gate in front of its connections.
func newEnvGated(t testing.TB, kind string, mutate func(*gateway.Config)) (*env, *writeGate) {
	t.Helper()
	g := &writeGate{}
	g.changed = sync.NewCond(&g.mu)
	e := startEnvListener(t, brokertest.NATS(t), kind, nil, mutate, nil, func(l net.Listener) net.Listener {
		return gatedListener{l, g}
	})
	t.Cleanup(func() { g.hold("") }) // before the gateway's shutdown (cleanups run last first)
	return e, g
}

// hold holds up writes to the client at addr (its local address; "":
// none) from now on.
func (g *writeGate) hold(addr string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.held = addr
	g.changed.Broadcast()
}

// waitingWrites is the number of writes held at the gate now.
func (g *writeGate) waitingWrites() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.waiting
}

// pass returns once writes to remote may go on.
func (g *writeGate) pass(remote string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.held != remote {
		return
	}
	g.waiting++
	for g.held == remote {
		g.changed.Wait()
	}
	g.waiting--
}

type gatedListener struct {
	net.Listener
	g *writeGate
}

func (l gatedListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return gatedConn{c, l.g}, nil
}

// gatedConn is a server connection whose writes pass its gate. It hides
// the TCP connection's SyscallConn: the gateway writes it with blocking
// writes (a writer goroutine's), never its shared flushers' non-blocking
// ones, which the gate could not hold.
type gatedConn struct {
	net.Conn
	g *writeGate
}

func (c gatedConn) Write(p []byte) (int, error) {
	c.g.pass(c.RemoteAddr().String())
	return c.Conn.Write(p)
}
