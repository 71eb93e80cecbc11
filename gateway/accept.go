package gateway

import (
	"bufio"
	"context"
	"errors"
	"net"
	"net/http"
	"strconv"
	"syscall"
	"time"

	"github.com/coder/websocket"
	"github.com/fanwire/fanwire/gateway/auth"
	"github.com/fanwire/fanwire/gateway/internal/admission"
	"github.com/fanwire/fanwire/gateway/internal/fanout"
	"github.com/fanwire/fanwire/gateway/internal/netconn"
	"github.com/fanwire/fanwire/gateway/internal/presence"
	"go.uber.org/zap"
)

// Accepting a connection: an upgrade request passes the connection caps,
// the per-address cap and the connect rate (package internal/admission),
// is authenticated and upgraded, and becomes a conn with its fanout.Client,
// registered with the Server until it ends.

func (s *Server) serveWS(w http.ResponseWriter, r *http.Request) { s.serveConn(w, r, false) }

// serveConn upgrades and serves one connection: the native protocol, or
// GraphQL over WebSocket.
func (s *Server) serveConn(w http.ResponseWriter, r *http.Request, gql bool) {
	// The caps first: a request they refuse costs nothing, and one that
	// waits for admission below holds its place under them (one address
	// cannot fill the queue past its own cap).
	if n := s.nconns.Add(1); n > int64(s.cfg.MaxConnections) {
		s.nconns.Add(-1)
		s.refuseUpgrade(w, http.StatusServiceUnavailable, 5, "too many connections", CodeMaxConnections)
		return
	}
	ip := s.proxies.ClientAddr(r)
	group := admission.IPGroup(ip, s.cfg.IPLimitIPv6Prefix)
	if !s.perIP.Acquire(group, s.cfg.MaxConnectionsPerIP) {
		s.nconns.Add(-1)
		s.refuseUpgrade(w, http.StatusTooManyRequests, 5, "too many connections from this address", CodeMaxConnectionsPerIP)
		return
	}
	served := false
	defer func() {
		if !served {
			s.nconns.Add(-1)
			s.perIP.Release(group)
		}
	}()

	if !isWebSocketUpgrade(r) { // only on /ws: /graphql answers plain requests over HTTP
		// A plain request on /ws is a mistake or a probe. The websocket
		// library would answer 426 and keep the connection alive for
		// another request, for the 120 s idle timeout: close it instead.
		// net/http closes only when the first Connection value is exactly
		// "close"; "Upgrade" must be listed too beside an Upgrade header.
		s.metrics.ConnectionsRejected.WithLabelValues("bad_upgrade").Inc()
		w.Header().Set("Upgrade", "websocket")
		w.Header()["Connection"] = []string{"close", "Upgrade"}
		writeJSON(w, http.StatusUpgradeRequired, apiError{Error: "this endpoint speaks WebSocket only: send an upgrade request", Code: "bad_upgrade"})
		return
	}
	// The connect rate, before any authentication work (package internal/admission).
	switch retry, err := s.admit.Wait(r.Context()); {
	case err == nil:
	case errors.Is(err, admission.ErrConnectRate):
		s.refuseUpgrade(w, http.StatusServiceUnavailable, retry, "too many connection attempts: retry later", CodeConnectRate)
		return
	case errors.Is(err, admission.ErrClosed):
		s.refuseUpgrade(w, http.StatusServiceUnavailable, 5, "server going away", CodeShuttingDown)
		return
	default:
		return // the client went away while it waited
	}
	var grants *auth.Grants
	var refused error
	if !gql && s.cfg.Authenticate != nil {
		// The native protocol has no init message: credentials come with
		// the upgrade request. A refusal is told after the upgrade, as a
		// close (4401) with the reason: a browser sees nothing of an HTTP
		// 401, and could not tell a refused token from a node that is down.
		grants, refused = s.cfg.Authenticate(r.Context(), r, nil)
	}
	// c is set before the connection reads. Until then a ping can arrive
	// only while an upgrade refused for its subprotocol (4406) waits for
	// the close handshake: no pong then.
	var c *conn
	opts := &websocket.AcceptOptions{
		OriginPatterns:  s.cfg.AllowedOrigins,
		CompressionMode: websocket.CompressionDisabled,
		OnPingReceived:  func(ctx context.Context, p []byte) bool { return c != nil && c.onPing(ctx, p) },
		OnPongReceived: func(_ context.Context, p []byte) {
			if c != nil {
				c.onPong(p)
			}
		},
	}
	if gql {
		// Listed in order of preference: the library picks the first the
		// client offers too.
		opts.Subprotocols = []string{subprotoTransportWS, subprotoLegacy}
	}
	var fw *netconn.FrameWriter
	var br *bufio.Reader
	var nc net.Conn
	var prefix *netconn.PrefixConn
	ws, err := websocket.Accept(netconn.HijackWriter{ResponseWriter: w, FW: &fw, BR: &br, NC: &nc, Prefix: &prefix}, r, opts)
	if err != nil {
		s.metrics.ConnectionsRejected.WithLabelValues("bad_upgrade").Inc()
		s.log.Debug("websocket upgrade failed", zap.Error(err), zap.String("remote", ip))
		return // Accept wrote the HTTP error
	}
	ws.SetReadLimit(s.cfg.ReadLimit)
	if refused != nil {
		s.metrics.ConnectionsRejected.WithLabelValues("unauthorized").Inc()
		_ = ws.Close(CloseUnauthorized, closeReason("unauthorized: "+refused.Error()))
		return
	}
	if gql && ws.Subprotocol() == "" {
		s.metrics.ConnectionsRejected.WithLabelValues("bad_subprotocol").Inc()
		_ = ws.Close(CloseSubprotocol, "Subprotocol not acceptable: offer graphql-transport-ws (or graphql-ws)")
		return
	}
	c = &conn{
		s:      s,
		ws:     ws,
		fw:     fw,
		remote: ip,
		since:  time.Now(),
		id:     newConnID(),
		ctx:    s.ctx,
		stop:   make(chan struct{}),
		subs:   make(map[string]*subState),
		park:   parking{br: br, prefix: prefix},
		pings:  pings{pong: make(chan struct{}, 1)},
	}
	c.setGrants(grants)
	if prefix != nil {
		nc = prefix.Conn
	}
	if sc, ok := nc.(syscall.Conn); ok { // plain TCP; a TLS connection keeps its reader goroutine
		c.park.place.RC, _ = sc.SyscallConn()
	}
	c.cl = fanout.NewClient(s.cfg.MailboxMessages, s.cfg.MailboxBytes, c.overflow)
	c.filters = fanout.NewFilterBudget(s.cfg.FilterCostRate)
	if s.cfg.Authenticate != nil {
		c.req = r // refresh and connection_init authenticate with it
	}
	if gql {
		c.gql = &gqlConn{legacy: ws.Subprotocol() == subprotoLegacy, exec: s.gqlExec, ops: make(map[string]*gqlOp)}
		c.cl.Encode = c.gql.encode
	}
	c.pc = presence.Conn{ID: c.id, Client: c.cl, Parts: gql}
	// Set before the connection is registered: Shutdown may wake its
	// writer (a 1001 close) as soon as it is in s.conns.
	c.cl.OnWake = c.ensureWriter
	if !gql && fw.NonBlocking() {
		c.shared.pool = s.flush // its frames go out on the shared flushers
		c.cl.OnBehind = c.hurry
	}
	c.runCtx, c.cancelRun = context.WithCancel(c.ctx)

	s.mu.Lock()
	if s.draining {
		s.mu.Unlock()
		c.cancelRun()
		s.metrics.ConnectionsRejected.WithLabelValues("shutting_down").Inc()
		_ = ws.Close(CloseGoingAway, "server going away")
		return
	}
	s.conns[c] = struct{}{}
	s.wg.Add(1)
	s.mu.Unlock()
	s.metrics.ConnectionsAccepted.Inc()
	s.metrics.Connections.Inc()

	// The connection runs on a goroutine of ours and the handler returns:
	// net/http's per-connection state (its 4 KiB read and write buffers,
	// the request, the handler goroutine's stack grown by request parsing)
	// would otherwise stay alive as long as the WebSocket does, 3x the
	// memory of an idle connection. The server's WaitGroup owns it.
	served = true
	// The connection's last reader runs onEnd: the reader may park (no
	// goroutine) and be restarted by the idle poller any number of times.
	c.onEnd = func() {
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
		s.metrics.Connections.Dec()
		s.perIP.Release(group)
		s.nconns.Add(-1)
		s.wg.Done()
	}
	go c.serve()
}

// refuseUpgrade answers an upgrade request with status, Retry-After and
// the JSON error, counted under code, and closes the connection: kept
// alive, each refused client of a storm would hold net/http's goroutine
// and buffers for the idle timeout, outside every cap.
func (s *Server) refuseUpgrade(w http.ResponseWriter, status, retryAfter int, msg, code string) {
	s.metrics.ConnectionsRejected.WithLabelValues(code).Inc()
	w.Header().Set("Connection", "close")
	w.Header().Set("Retry-After", strconv.Itoa(retryAfter))
	writeJSON(w, status, apiError{Error: msg, Code: code})
}
