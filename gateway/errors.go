package gateway

import (
	"errors"

	"github.com/fanwire/fanwire/gateway/internal/fanout"
	"github.com/fanwire/fanwire/subject"
)

// Error codes sent to native clients in {"type":"error","code":...}. They are
// the wire contract: docs/protocol.md lists the same set.
const (
	CodeBadFrame             = "bad_frame"                // not a JSON object, unknown field, binary frame, wrong field type
	CodeUnknownType          = "unknown_type"             // "type" is not one the server knows
	CodeBadPattern           = "bad_pattern"              // invalid subject pattern, or outside the subject space
	CodeDuplicateID          = "duplicate_id"             // subscribe with an id that is already active
	CodeUnknownID            = "unknown_id"               // unsubscribe with an id that is not active
	CodeTooManySubscriptions = "too_many_subscriptions"   // over Config.MaxSubscriptions
	CodeBadCursor            = "bad_cursor"               // "from" malformed, from another broker, ahead of the stream, or no history kept
	CodeCursorExpired        = "cursor_expired"           // "from" older than the broker's retention: re-sync
	CodeDurableInUse         = "durable_in_use"           // "durable" is bound by another subscription on this node (often the same client's previous connection, until its ping timeout): retry later
	CodeBadDurable           = "bad_durable"              // "durable" malformed, bound to another pattern, no consumers on this broker, or a connection that keeps none (anonymous without AnonymousDurables, a token without sub)
	CodeBrokerUnavailable    = "broker_unavailable"       // the broker could not start the subscription's replay or consumer: retry
	CodeForbidden            = "forbidden"                // the connection's grants do not contain the pattern
	CodeUnauthorized         = "unauthorized"             // a refresh whose token was refused: invalid, empty, another sub, anonymous, or no exp where the connection's had one
	CodeRevoked              = "revoked"                  // a subscription a refresh's new token does not grant: it has ended
	CodeTooManyDurables      = "too_many_durables"        // a new durable past Config.MaxDurables for the token's sub
	CodeRateLimited          = "rate_limited"             // over Config.MaxMessageRate: the message was dropped
	CodeBadSubject           = "bad_subject"              // publish: invalid subject, a wildcard, or outside the subject space
	CodeBadFilter            = "bad_filter"               // subscribe: "where" does not compile (the message names the position), or the grant's filter does not
	CodeViewTooLarge         = fanout.CodeViewTooLarge    // a snapshot or a filtered subscription's view passed Config.MaxSnapshot documents: it has ended
	CodeFilterTooCostly      = fanout.CodeFilterTooCostly // a filtered subscription whose evaluation took the connection's filters past Config.MaxFilterCostPerEvent for one event: it has ended; or a subscribe whose filters would hold more than maxConnExprBytes of compiled programs
	CodeTooLarge             = "too_large"                // publish: data over Config.MaxPublishBytes or the broker's message limit, or an event over Config.MailboxBytes
)

// clientErrorCodes are the codes a connection's client errors are counted
// under (fanwire_client_errors_total{code}): the native codes above and
// the presence ones, as docs/protocol.md's Errors table lists them, and
// GraphQL's query_limit. Each is exported at 0 from the start.
var clientErrorCodes = []string{
	CodeBadFrame, CodeUnknownType, CodeBadPattern, CodeDuplicateID, CodeUnknownID, CodeTooManySubscriptions,
	CodeBadCursor, CodeCursorExpired, CodeDurableInUse, CodeBadDurable, CodeBrokerUnavailable, CodeForbidden,
	CodeUnauthorized, CodeRevoked, CodeTooManyDurables, CodeRateLimited, CodeBadSubject, CodeBadFilter,
	CodeViewTooLarge, CodeFilterTooCostly, CodeTooLarge, CodeTooManyTracks, CodeTooManyMembers, CodeQueryLimit,
}

// Publish refusals of POST /api/publish and the GraphQL publish mutation
// over HTTP (besides the codes above).
const (
	CodePublishDisabled = "publish_disabled" // no publish credential configured and no AllowAnonymousPublish: 403
)

// Refusals of an upgrade request (/ws, /graphql) before the upgrade: an
// HTTP status with Retry-After and a JSON body {"error","code"}, counted in
// fanwire_connections_rejected_total under the code.
const (
	CodeMaxConnections      = "max_connections"        // 503: the node has Config.MaxConnections
	CodeMaxConnectionsPerIP = "max_connections_per_ip" // 429: the client address has Config.MaxConnectionsPerIP
	CodeConnectRate         = "connect_rate"           // 503: over Config.MaxConnectRate with the queue full, or a wait past ConnectQueueWait
	CodeShuttingDown        = "shutting_down"          // 503: the node drains (a request that was waiting for admission)
)

// Answers of the admin API (the inspector, admin.go) besides
// unauthorized (401, a missing or wrong admin key).
const (
	CodeBadRequest = "bad_request" // 400: a malformed query or body, a close code an operator may not use
	CodeNotFound   = "not_found"   // 404: no admin API on this node (no Config.AdminKey), no such endpoint, or no connection with that id
)

// CodeWebSocketRequired is the extensions.code of the GraphQL track and
// untrack mutations over HTTP: a member is a WebSocket connection, which
// leaves when it closes.
const CodeWebSocketRequired = "websocket_required"

// CodeQueryLimit is the extensions.code of a GraphQL operation (HTTP or
// WebSocket) refused before validation by a query limit (Config.GraphQLMax*:
// bytes, tokens, depth, aliases, complexity); extensions.limit names which.
// A POST /graphql body over Config.GraphQLMaxBodyBytes is too_large (413).
const CodeQueryLimit = "query_limit"

// WebSocket close codes the server uses.
const (
	CloseGoingAway    = 1001 // server draining: reconnect elsewhere
	CloseInvalidUTF8  = 1007 // a text message that is not valid UTF-8 (RFC 6455 §8.1)
	ClosePolicy       = 1008 // repeated protocol abuse
	CloseTooBig       = 1009 // client frame over the read limit (sent by the websocket library)
	CloseSlowConsumer = 4008 // mailbox overflowed: reconnect (and resume from a cursor where the broker keeps history)
	CloseTokenExpired = 4001 // the connection's token expired without a refresh: reconnect with a new one
)

// Sentinel errors; validation errors wrap them with the offending value.
var (
	ErrBadPattern   = subject.ErrBadPattern // subject.ErrBadPattern, for errors.Is on either
	ErrBadFrame     = errors.New("bad frame")
	ErrUnknownType  = errors.New("unknown type")
	ErrMailboxFull  = fanout.ErrMailboxFull // a delivery refused: the connection is a slow consumer
	ErrServerClosed = errors.New("gateway: server closed")
)

// Close codes of graphql-transport-ws (the graphql-ws npm package's
// PROTOCOL.md). The legacy protocol gets the same ones.
const (
	CloseBadRequest        = 4400 // malformed or unexpected message
	CloseUnauthorized      = 4401 // subscribe before connection_ack; native: a refused token, right after the upgrade
	CloseForbidden         = 4403 // connection_init refused by authentication
	CloseSubprotocol       = 4406 // no subprotocol the server speaks
	CloseInitTimeout       = 4408 // no connection_init in time
	CloseSubscriberExists  = 4409 // subscribe with an id already in use
	CloseTooManyInitialise = 4429 // a second connection_init
)
