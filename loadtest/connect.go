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
	if cfg.RcvBuf > 0 {
		opts.HTTPClient = &http.Client{Transport: &http.Transport{DialContext: netDialer(cfg).DialContext}}
	}
	conn, _, err := websocket.Dial(ctx, cfg.URL, opts)
	if err != nil {
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

// netDialer dials TCP with the run's socket options (cfg.RcvBuf).
func netDialer(cfg *Config) *net.Dialer {
	if cfg.RcvBuf <= 0 {
		return &net.Dialer{}
	}
	return &net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		if err := rc.Control(func(fd uintptr) {
			serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, cfg.RcvBuf)
		}); err != nil {
			return err
		}
		return serr
	}}
}

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
// first events there.
func handshake(ctx context.Context, conn *websocket.Conn, s subscription) (cursor string, rest []byte, err error) {
	if _, err := await(ctx, conn, func(m *controlMsg) bool { return m.Type == "ready" }); err != nil {
		return "", nil, fmt.Errorf("await ready: %w", err)
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

// writeSubscribe sends the native subscribe for s, with id subID.
func writeSubscribe(ctx context.Context, conn *websocket.Conn, s subscription) error {
	msg, err := json.Marshal(struct {
		Type    string `json:"type"`
		ID      string `json:"id"`
		Subject string `json:"subject"`
		Where   string `json:"where,omitempty"`
		From    string `json:"from,omitempty"`
	}{"subscribe", subID, s.subject, s.where, s.from})
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
