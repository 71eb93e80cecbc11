package loadtest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"sync"
	"syscall"

	"github.com/coder/websocket"
)

// dialConcurrency bounds the dials in flight, so connecting thousands of
// clients does not hit the gateway (and its accept backlog) all at once.
const dialConcurrency = 50

// subID is the subscription id every client uses; ids are per connection.
const subID = "s1"

// connectAll dials cfg.Clients clients, at most dialConcurrency at a time, and
// returns once all are subscribed. On the first failure it cancels the rest,
// closes the clients already connected and returns that failure.
func connectAll(ctx context.Context, cfg *Config) ([]*client, error) {
	if err := checkFileLimit(cfg.Clients); err != nil {
		return nil, err
	}
	dctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	clients := make([]*client, cfg.Clients)
	sem := make(chan struct{}, dialConcurrency)
	var wg sync.WaitGroup
dial:
	for i := range clients {
		select {
		case sem <- struct{}{}:
		case <-dctx.Done():
			break dial
		}
		wg.Go(func() {
			defer func() { <-sem }()
			c, err := dialClient(dctx, cfg, i)
			if err != nil {
				cancel(err) // the first cause wins; later ones are mostly "context canceled"
				return
			}
			clients[i] = c
		})
	}
	wg.Wait()
	if dctx.Err() != nil {
		closeAll(ctx, clients)
		return nil, context.Cause(dctx)
	}
	return clients, nil
}

// checkFileLimit fails at once when this process cannot open clients
// sockets (RLIMIT_NOFILE, which the Go runtime has raised to its hard
// limit), rather than after connecting most of them.
func checkFileLimit(clients int) error {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil || rl.Cur > 1<<40 {
		return nil
	}
	const spare = 64 // the broker connection, the spawned gateway's pipes, /proc reads
	if uint64(clients)+spare > rl.Cur {
		return fmt.Errorf("%d clients need %d file descriptors, and this process may open %d (ulimit -n): raise the limit, or split the clients over several loadtest processes", clients, clients+spare, rl.Cur)
	}
	return nil
}

// closeAll closes every non-nil client's connection concurrently and waits.
func closeAll(ctx context.Context, clients []*client) {
	var wg sync.WaitGroup
	for _, c := range clients {
		if c != nil {
			wg.Go(func() { closeConn(ctx, c.conn) })
		}
	}
	wg.Wait()
}

// dialClient connects one client and subscribes it to cfg.Subject; the dial
// and the handshake together get cfg.Timeout.
func dialClient(ctx context.Context, cfg *Config, id int) (*client, error) {
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	// Nothing is published before every client has subscribed, so no
	// event follows the reply in its frame.
	conn, cursor, _, err := openAs(ctx, cfg, cfg.clientSub(id))
	if err != nil {
		return nil, fmt.Errorf("client %d: %w", id, err)
	}
	c := &client{id: id, gql: cfg.Proto == ProtoGraphQL, conn: conn, subCursor: cursor, v: cfg.newClientVerifier(id)}
	if cfg.PublishVia == PublishViaWS {
		c.wantAcks = int64(cfg.Events) // its own events' "published" replies, read on this connection
	}
	return c, nil
}

// open dials a client connection in cfg.Proto and subscribes it to
// cfg.Subject (from the cursor from, unless it is ""). It returns the
// native "subscribed" reply's cursor and the messages that followed it in
// its frame; a GraphQL subscription has neither. On failure the
// connection is closed.
func open(ctx context.Context, cfg *Config, from string) (conn wireConn, cursor string, rest []byte, err error) {
	return openAs(ctx, cfg, subscription{subject: cfg.Subject, from: from})
}

// openAs is open with a subscription of any kind (a where: native only).
func openAs(ctx context.Context, cfg *Config, sub subscription) (conn wireConn, cursor string, rest []byte, err error) {
	from := sub.from
	if cfg.Proto == ProtoGraphQL {
		var gc *wsConn
		if gc, err = dialGraphQL(ctx, cfg); err == nil {
			conn = gc
			err = gqlHandshake(ctx, gc, cfg.Subject, from)
		}
	} else {
		var nc *websocket.Conn
		if nc, err = dialWS(ctx, cfg); err == nil {
			conn = &nativeConn{Conn: nc}
			cursor, rest, err = handshake(ctx, nc, sub)
		}
	}
	if err != nil {
		if conn != nil {
			_ = conn.CloseNow()
		}
		return nil, "", nil, err
	}
	return conn, cursor, rest, nil
}

// dialWS opens one WebSocket to the gateway's native endpoint with the
// run's socket options.
func dialWS(ctx context.Context, cfg *Config) (*websocket.Conn, error) {
	opts := &websocket.DialOptions{CompressionMode: websocket.CompressionDisabled}
	if cfg.RcvBuf > 0 || cfg.SourceAddrs > 0 {
		opts.HTTPClient = &http.Client{Transport: &http.Transport{DialContext: netDialer(cfg).DialContext}}
	}
	conn, resp, err := websocket.Dial(ctx, cfg.URL, opts)
	if err != nil {
		if resp != nil && resp.StatusCode != http.StatusSwitchingProtocols {
			return nil, fmt.Errorf("dial %s: %w: %d %s", cfg.URL, ErrUpgradeRefused, resp.StatusCode, http.StatusText(resp.StatusCode))
		}
		return nil, fmt.Errorf("dial %s: %w", cfg.URL, err)
	}
	conn.SetReadLimit(readLimit)
	return conn, nil
}

// dialGraphQL opens one graphql-transport-ws WebSocket to the gateway's
// GraphQL endpoint with the run's socket options, on our own lean client.
func dialGraphQL(ctx context.Context, cfg *Config) (*wsConn, error) {
	conn, err := wsDial(ctx, netDialer(cfg), cfg.GraphQLURL, gqlSubprotocol)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", cfg.GraphQLURL, err)
	}
	return conn, nil
}

// netDialer dials TCP with the run's socket options: cfg.RcvBuf, and with
// cfg.SourceAddrs the next loopback source address in turn.
func netDialer(cfg *Config) *net.Dialer {
	d := &net.Dialer{}
	var ip net.IP
	if cfg.SourceAddrs > 0 {
		// 127.0.0.2, 127.0.0.3, ...: the whole of 127/8 is the loopback
		// interface's, and each source address has its own ephemeral ports.
		k := int(cfg.nextSource.Add(1)-1) % cfg.SourceAddrs
		ip = net.IPv4(127, 0, byte(k/250), byte(2+k%250))
		d.LocalAddr = &net.TCPAddr{IP: ip}
	}
	if cfg.RcvBuf <= 0 && ip == nil {
		return d
	}
	d.Control = func(_, _ string, rc syscall.RawConn) error {
		var serr error
		if err := rc.Control(func(fd uintptr) {
			if cfg.RcvBuf > 0 {
				serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, cfg.RcvBuf)
			}
			if ip != nil && serr == nil {
				// Pick the port at connect, by the whole 4-tuple, not at
				// bind: a bound port is not reused for other servers.
				serr = syscall.SetsockoptInt(int(fd), syscall.IPPROTO_IP, ipBindAddressNoPort, 1)
			}
		}); err != nil {
			return err
		}
		return serr
	}
	return d
}

// ipBindAddressNoPort is Linux's IP_BIND_ADDRESS_NO_PORT (not in package
// syscall).
const ipBindAddressNoPort = 24

// controlMsg is the union of the handshake messages a client may receive.
type controlMsg struct {
	Type         string `json:"type"`
	ID           string `json:"id"`
	ConnectionID string `json:"connection_id"`
	Code         string `json:"code"`
	Message      string `json:"message"`
	Cursor       string `json:"cursor"`
}

// handshake waits for "ready", subscribes and waits for "subscribed". It
// returns the reply's cursor and the messages that followed the reply in
// its frame: a subscription that resumes while events flow may get its
// first events there. A client's own pattern (s.own) is subscribed first:
// nothing is published on it, so nothing but its reply can come before
// that reply, while events may follow the main subscription's at once.
func handshake(ctx context.Context, conn *websocket.Conn, s subscription) (cursor string, rest []byte, err error) {
	if err := awaitReady(ctx, conn); err != nil {
		return "", nil, err
	}
	return subscribeAll(ctx, conn, s)
}

// awaitReady waits for the gateway's "ready".
func awaitReady(ctx context.Context, conn *websocket.Conn) error {
	if _, err := await(ctx, conn, func(m *controlMsg) bool { return m.Type == "ready" }); err != nil {
		return fmt.Errorf("await ready: %w", err)
	}
	return nil
}

// subscribeAll is handshake after "ready": it subscribes s (and its own
// pattern) and returns the reply's cursor and what followed it.
func subscribeAll(ctx context.Context, conn *websocket.Conn, s subscription) (cursor string, rest []byte, err error) {
	if s.own != "" {
		if err := writeSubscribeAs(ctx, conn, ownSubID, subscription{subject: s.own}); err != nil {
			return "", nil, fmt.Errorf("subscribe %s: %w", s.own, err)
		}
		if _, err := await(ctx, conn, func(m *controlMsg) bool { return m.Type == "subscribed" && m.ID == ownSubID }); err != nil {
			return "", nil, fmt.Errorf("await subscribed %s: %w", s.own, err)
		}
	}
	if err := writeSubscribe(ctx, conn, s); err != nil {
		return "", nil, fmt.Errorf("subscribe: %w", err)
	}
	rest, err = await(ctx, conn, func(m *controlMsg) bool {
		cursor = m.Cursor
		return m.Type == "subscribed" && m.ID == subID
	})
	if err != nil {
		return "", nil, fmt.Errorf("await subscribed: %w", err)
	}
	return cursor, rest, nil
}

// ownSubID is the id of a client's own pattern (Config.OwnPattern).
const ownSubID = "s2"

// writeSubscribe sends the native subscribe for s, with id subID.
func writeSubscribe(ctx context.Context, conn *websocket.Conn, s subscription) error {
	return writeSubscribeAs(ctx, conn, subID, s)
}

// writeSubscribeAs sends the native subscribe for s, with id id.
func writeSubscribeAs(ctx context.Context, conn *websocket.Conn, id string, s subscription) error {
	msg, err := json.Marshal(struct {
		Type    string `json:"type"`
		ID      string `json:"id"`
		Subject string `json:"subject"`
		Where   string `json:"where,omitempty"`
		From    string `json:"from,omitempty"`
	}{"subscribe", id, s.subject, s.where, s.from})
	if err != nil {
		return fmt.Errorf("encode subscribe: %w", err)
	}
	return conn.Write(ctx, websocket.MessageText, msg)
}

// await reads messages until want accepts one and returns what followed
// that one in its frame. An error message fails with ErrRejected; messages
// want does not accept are skipped. Handshakes are rare, so encoding/json
// is fine here.
func await(ctx context.Context, conn *websocket.Conn, want func(*controlMsg) bool) (rest []byte, err error) {
	for {
		_, frame, err := conn.Read(ctx)
		if err != nil {
			return nil, err
		}
		for len(frame) > 0 {
			var line []byte
			line, frame = nextMessage(frame)
			if len(bytes.TrimSpace(line)) == 0 {
				continue
			}
			var m controlMsg
			if err := json.Unmarshal(line, &m); err != nil {
				return nil, fmt.Errorf("%w: message %.200q: %w", ErrProtocol, line, err)
			}
			if m.Type == "error" {
				return nil, fmt.Errorf("%w: %s: %s", ErrRejected, m.Code, m.Message)
			}
			if want(&m) {
				return frame, nil
			}
		}
	}
}
