package loadtest

import "errors"

// Sentinel errors; Run wraps them with the offending value or server reply.
var (
	// ErrInvalidConfig: a Config field is out of range. The message names the field.
	ErrInvalidConfig = errors.New("invalid config")
	// ErrRejected: the gateway answered the connection or subscription with
	// {"type":"error"}. The message carries its code and text.
	ErrRejected = errors.New("gateway replied with an error")
	// ErrProtocol: the gateway sent something the native protocol does not allow
	// during the handshake (not JSON, or the connection closed before "subscribed").
	ErrProtocol = errors.New("protocol violation")
	// ErrNotDurable: a run that resumes clients needs a broker that keeps
	// history (JetStream or Redis Streams), and the gateway's does not.
	ErrNotDurable = errors.New("the gateway's broker keeps no history")
	// ErrPublishRefused: a client's POST /api/publish (Config.PublishVia
	// http) was answered with something other than 200; the message
	// carries the status and the answer.
	ErrPublishRefused = errors.New("publish refused")
	// ErrUpgradeRefused: the gateway answered a WebSocket upgrade with an
	// HTTP status instead of 101, such as 503 (max_connections) or 429
	// (max_connections_per_ip); the message carries the status.
	ErrUpgradeRefused = errors.New("upgrade refused")
)
