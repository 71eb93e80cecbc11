package gateway

import (
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
)

// The HTTP server in front of the gateway. Its limits are the first line
// against hostile clients, so they belong to the gateway, not to whoever
// wires it: fanwire ws and the tests serve through the same HTTPServer.
const (
	// httpIdleTimeout is how long a keep-alive HTTP connection (publishes,
	// probes) may wait for its next request. WebSocket connections are
	// hijacked and never idle in net/http's sense.
	httpIdleTimeout = 120 * time.Second
	// maxHeaderBytes bounds an upgrade request's headers (a bearer token
	// fits many times over); over it net/http answers 431 and closes.
	// net/http's default is 1 MiB.
	maxHeaderBytes = 64 << 10
)

// HTTPServer returns the http.Server to serve Handler with: a connection
// must complete its request headers within Config.HandshakeTimeout of the
// TCP accept (for an upgrade, that bounds the time to a WebSocket), a
// request body (POST /api/publish, POST /graphql) must arrive within as long
// again, headers are at most 64 KiB, and a keep-alive connection is closed
// after 120 s without a request. Connections closed before their first request's
// headers arrived, at or after the handshake timeout, are counted in
// fanwire_connections_rejected_total{reason="handshake_timeout"}; while
// Config.MaxHandshakes connections wait for their first request, a new one
// is closed at once (reason "max_handshakes").
//
// There is no read or write timeout: an upgraded connection's lifetime is
// governed by pings (PingInterval, PingTimeout) and its mailbox bounds.
//
// Its Shutdown refuses the upgrade requests waiting for admission (503
// shutting_down), as Server.Shutdown does: net/http's Shutdown waits for
// every request in a handler, and a waiting one would hold it up to
// ConnectQueueWait.
func (s *Server) HTTPServer() *http.Server {
	hs := &http.Server{
		Handler:           s.handshakes.handler(s.mux),
		ReadHeaderTimeout: s.cfg.HandshakeTimeout,
		IdleTimeout:       httpIdleTimeout,
		MaxHeaderBytes:    maxHeaderBytes,
		ConnContext:       s.handshakes.connContext,
		ConnState:         s.handshakes.connState,
		ErrorLog:          zap.NewStdLog(s.log.Named("http")),
	}
	hs.RegisterOnShutdown(s.admit.Close)
	return hs
}

// handshakes tracks connections that have not yet had a request handled,
// to count the ones the handshake timeout closes. net/http closes them
// itself (ReadHeaderTimeout) and tells no one; its ConnState hook sees the
// close, and the handler marks a connection whose request got through.
type handshakes struct {
	timeout  time.Duration       // static
	max      int                 // static: most pending connections (Config.MaxHandshakes)
	rejected func(reason string) // static: counts one rejected connection

	mu      sync.Mutex
	pending map[net.Conn]*pendingConn // guarded by mu: accepted, first request not yet past its handler
}

type pendingConn struct {
	accepted time.Time   // static
	handled  atomic.Bool // a request reached the handler
}

type pendingKey struct{}

// connContext runs in net/http's accept loop, once per connection. Over
// the cap, it closes the connection before net/http reads from it: its
// goroutine finds it closed and ends.
func (h *handshakes) connContext(ctx context.Context, c net.Conn) context.Context {
	p := &pendingConn{accepted: time.Now()}
	h.mu.Lock()
	if h.pending == nil {
		h.pending = make(map[net.Conn]*pendingConn)
	}
	full := h.max > 0 && len(h.pending) >= h.max
	if !full {
		h.pending[c] = p
	}
	h.mu.Unlock()
	if full {
		_ = c.Close()
		h.rejected("max_handshakes")
	}
	return context.WithValue(ctx, pendingKey{}, p)
}

// handler marks the request's connection as past its handshake, and gives
// a request body the handshake timeout to arrive: net/http's only body
// timeout, ReadTimeout, would also cut every WebSocket (its deadline stays
// on the hijacked connection), and without one a body trickling in a byte
// at a time would hold its connection forever.
func (h *handshakes) handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if p, ok := r.Context().Value(pendingKey{}).(*pendingConn); ok {
			p.handled.Store(true)
		}
		if r.Body != nil && r.Body != http.NoBody {
			rc := http.NewResponseController(w)
			if rc.SetReadDeadline(time.Now().Add(h.timeout)) == nil {
				r.Body = &bodyDeadline{ReadCloser: r.Body, rc: rc}
			}
		}
		next.ServeHTTP(w, r)
	})
}

// bodyDeadline clears the connection's read deadline once the whole body
// has been read: net/http then reads on in the background while the
// handler runs, to notice a client going away, and a deadline passing then
// would cancel the request's context (a publish waiting for the broker).
// After any other error the deadline stays: net/http discards what is left
// of a body after the handler, and would wait for a trickling one forever.
type bodyDeadline struct {
	io.ReadCloser
	rc   *http.ResponseController
	done bool // owned by the handler reading the body
}

func (b *bodyDeadline) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF && !b.done {
		b.done = true
		_ = b.rc.SetReadDeadline(time.Time{})
	}
	return n, err
}

// connState forgets a connection once its first request is done (idle,
// hijacked: from then on net/http's own timeouts apply), and counts one
// that closes without a handled request at least the timeout after its
// accept: its headers did not arrive in time (a silent connection, or one
// trickling its headers), whoever closed it.
func (h *handshakes) connState(c net.Conn, st http.ConnState) {
	switch st {
	case http.StateIdle, http.StateHijacked, http.StateClosed:
	default:
		return
	}
	h.mu.Lock()
	p, ok := h.pending[c]
	delete(h.pending, c)
	h.mu.Unlock()
	if ok && st == http.StateClosed && !p.handled.Load() && time.Since(p.accepted) >= h.timeout {
		h.rejected("handshake_timeout")
	}
}

// isWebSocketUpgrade reports whether r asks for a WebSocket upgrade.
func isWebSocketUpgrade(r *http.Request) bool {
	return headerContainsToken(r.Header, "Connection", "upgrade") && headerContainsToken(r.Header, "Upgrade", "websocket")
}

// headerContainsToken reports whether the comma-separated header name holds
// token (case-insensitive), as an upgrade request's Connection: keep-alive,
// Upgrade does.
func headerContainsToken(h http.Header, name, token string) bool {
	for _, v := range h.Values(name) {
		for t := range strings.SplitSeq(v, ",") {
			if strings.EqualFold(strings.TrimSpace(t), token) {
				return true
			}
		}
	}
	return false
}
