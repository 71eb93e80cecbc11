package loadtest

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"strings"
)

// Protocols a run's clients speak (Config.Proto).
const (
	ProtoNative  = "native"  // the gateway's own protocol at /ws
	ProtoGraphQL = "graphql" // GraphQL subscriptions over graphql-transport-ws at /graphql
)

// gqlSubprotocol is the WebSocket subprotocol the GraphQL clients offer.
const gqlSubprotocol = "graphql-transport-ws"

// gqlQuery is the subscription every GraphQL client runs: the event's
// subject, cursor and data, in the order parseNext expects them.
const gqlQuery = `subscription($s: String!, $f: String) { events(subject: $s, from: $f) { subject cursor data } }`

// graphQLURL derives the GraphQL endpoint from the native one: its path's
// final "/ws" (or an empty path) becomes "/graphql".
func graphQLURL(native string) (string, error) {
	u, err := url.Parse(native)
	if err != nil {
		return "", err
	}
	switch {
	case u.Path == "" || u.Path == "/":
		u.Path = "/graphql"
	case strings.HasSuffix(u.Path, "/ws"):
		u.Path = strings.TrimSuffix(u.Path, "/ws") + "/graphql"
	default:
		return "", fmt.Errorf("path %q does not end in /ws: give the GraphQL endpoint (GraphQLURL, --graphql-url)", u.Path)
	}
	u.RawPath = ""
	return u.String(), nil
}

// gqlMsg is the union of the handshake messages a GraphQL client may
// receive. Handshakes are rare, so encoding/json is fine here.
type gqlMsg struct {
	ID      string          `json:"id"`
	Type    string          `json:"type"`
	Payload json.RawMessage `json:"payload"`
}

// gqlRejection describes an error message's payload: its first error's
// message and extensions.code.
func gqlRejection(payload json.RawMessage) error {
	var errs []struct {
		Message    string `json:"message"`
		Extensions struct {
			Code string `json:"code"`
		} `json:"extensions"`
	}
	if err := json.Unmarshal(payload, &errs); err != nil || len(errs) == 0 {
		return fmt.Errorf("%w: %.200s", ErrRejected, payload)
	}
	code := errs[0].Extensions.Code
	if code == "" {
		code = "graphql"
	}
	return fmt.Errorf("%w: %s: %s", ErrRejected, code, errs[0].Message)
}

// gqlWrite sends one client message.
func gqlWrite(ctx context.Context, conn *wsConn, msg any) error {
	b, err := json.Marshal(msg)
	if err != nil {
		return err
	}
	return conn.WriteText(ctx, b)
}

// gqlAwait reads messages until one of type want arrives. An error message
// fails with ErrRejected, a server ping is answered; other messages are
// skipped.
func gqlAwait(ctx context.Context, conn *wsConn, want string) error {
	for {
		b, err := conn.ReadContext(ctx)
		if err != nil {
			return err
		}
		var m gqlMsg
		if err := json.Unmarshal(b, &m); err != nil {
			return fmt.Errorf("%w: message %.200q: %w", ErrProtocol, b, err)
		}
		switch m.Type {
		case want:
			return nil
		case "error":
			return gqlRejection(m.Payload)
		case "ping":
			if err := gqlWrite(ctx, conn, map[string]string{"type": "pong"}); err != nil {
				return fmt.Errorf("pong: %w", err)
			}
		}
	}
}

// gqlInit opens a graphql-transport-ws session: connection_init, then the
// server's connection_ack. wsDial has checked the subprotocol.
func gqlInit(ctx context.Context, conn *wsConn) error {
	if err := gqlWrite(ctx, conn, map[string]any{"type": "connection_init", "payload": struct{}{}}); err != nil {
		return fmt.Errorf("connection_init: %w", err)
	}
	if err := gqlAwait(ctx, conn, "connection_ack"); err != nil {
		return fmt.Errorf("await connection_ack: %w", err)
	}
	return nil
}

// gqlSubscribe starts the events subscription on subject, from the cursor
// from unless it is "". graphql-transport-ws has no "subscribed" reply:
// a live subscription (from "") is followed by a ping, and the pong,
// which the server's reader sends after it has registered the
// subscription, tells it is live (or the error reply comes first). A
// resuming one returns at once: its replay may start before any pong, and
// its events are for the reader, which counts an error reply as a server
// error.
func gqlSubscribe(ctx context.Context, conn *wsConn, subject, from string) error {
	vars := map[string]string{"s": subject}
	if from != "" {
		vars["f"] = from
	}
	sub := map[string]any{"id": subID, "type": "subscribe", "payload": map[string]any{"query": gqlQuery, "variables": vars}}
	if err := gqlWrite(ctx, conn, sub); err != nil {
		return fmt.Errorf("subscribe: %w", err)
	}
	if from != "" {
		return nil
	}
	if err := gqlWrite(ctx, conn, map[string]string{"type": "ping"}); err != nil {
		return fmt.Errorf("ping: %w", err)
	}
	if err := gqlAwait(ctx, conn, "pong"); err != nil {
		return fmt.Errorf("await pong after subscribe: %w", err)
	}
	return nil
}

// gqlHandshake initialises a GraphQL connection and subscribes it.
func gqlHandshake(ctx context.Context, conn *wsConn, subject, from string) error {
	if err := gqlInit(ctx, conn); err != nil {
		return err
	}
	return gqlSubscribe(ctx, conn, subject, from)
}
