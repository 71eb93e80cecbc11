package brokertest

import (
	"context"
	"io"
	"net"
	"sync"
	"testing"
)

// Proxy forwards TCP connections to a server, for tests that fail the
// network between a client and it: Freeze stops forwarding on the
// connections open (a dead path: nothing arrives, nothing is closed), Cut
// closes them, and a Pipe copies one direction its own way (holds,
// drops or cuts what it sees). It serves until the test ends; its cleanup
// closes every connection and waits for every goroutine it started.
type Proxy struct {
	ln     net.Listener
	target string
	cfg    ProxyConfig

	mu    sync.Mutex
	conns []*ProxyConn // guarded by mu
}

// ProxyConfig says how a Proxy copies each direction; nil is a plain
// copy, which Freeze stops.
type ProxyConfig struct {
	FromServer Pipe
	ToServer   Pipe
}

// A Pipe copies one direction of one proxied connection: it reads src
// until that fails or ctx (done at the test's end) is, and writes to dst
// what it chooses. When it returns, the connection is closed both ways.
type Pipe func(ctx context.Context, dst io.Writer, src io.Reader)

// ProxyConn is one proxied connection.
type ProxyConn struct {
	client, server net.Conn
	frozen         chan struct{} // closed by Freeze
	once           sync.Once
}

// StartProxy starts a proxy to target (host:port).
func StartProxy(t testing.TB, target string, cfg ProxyConfig) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{ln: ln, target: target, cfg: cfg}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() {
		cancel()
		ln.Close()
		p.Cut(p.Conns())
		wg.Wait()
	})
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			pc := &ProxyConn{client: c, server: s, frozen: make(chan struct{})}
			p.mu.Lock()
			p.conns = append(p.conns, pc)
			p.mu.Unlock()
			wg.Go(func() { pc.run(ctx, cfg.FromServer, c, s) })
			wg.Go(func() { pc.run(ctx, cfg.ToServer, s, c) })
		}
	})
	return p
}

// Addr is the proxy's address (host:port).
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Conns is every connection the proxy has accepted.
func (p *Proxy) Conns() []*ProxyConn {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]*ProxyConn(nil), p.conns...)
}

// Freeze stops forwarding on every connection open now, both ways,
// closing nothing, and returns them; later connections are forwarded as
// usual. It freezes only the plain copies (not a ProxyConfig's Pipes).
func (p *Proxy) Freeze() []*ProxyConn {
	conns := p.Conns()
	for _, pc := range conns {
		pc.once.Do(func() { close(pc.frozen) })
	}
	return conns
}

// Cut closes conns: both ends see the connection end.
func (p *Proxy) Cut(conns []*ProxyConn) {
	for _, pc := range conns {
		pc.client.Close()
		pc.server.Close()
	}
}

func (pc *ProxyConn) run(ctx context.Context, pipe Pipe, dst, src net.Conn) {
	if pipe != nil {
		pipe(ctx, dst, src)
		pc.client.Close()
		pc.server.Close()
		return
	}
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		select {
		case <-pc.frozen:
			// Nothing reads src or writes dst any more: the peers'
			// buffers fill and nothing arrives, until Cut.
			return
		default:
		}
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			dst.Close()
			return
		}
	}
}

// TCPPair returns both ends of a loopback TCP connection, closed when the
// test ends.
func TCPPair(t testing.TB) (server, client *net.TCPConn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	type accepted struct {
		c   net.Conn
		err error
	}
	ch := make(chan accepted, 1)
	go func() { // ends with the Accept, which the Dial or the Close ends
		c, err := ln.Accept()
		ch <- accepted{c, err}
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		ln.Close()
		<-ch
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	a := <-ch
	if a.err != nil {
		t.Fatal(a.err)
	}
	t.Cleanup(func() { a.c.Close() })
	return a.c.(*net.TCPConn), c.(*net.TCPConn)
}
