package schema

import "context"

// This file will not be regenerated automatically.

// Backend is what the resolvers need from the gateway serving the schema.
type Backend interface {
	Health(ctx context.Context) *Health
	Subscribable(ctx context.Context) *Subscribable
	// Events returns the stream of an events subscription the executor
	// serves. The gateway has validated the subscription and registered it
	// before the executor runs; this hands the executor its channel.
	Events(ctx context.Context, subject string, from, durable, where *string) (<-chan *Event, error)
	// Publish publishes one event with the credential of the connection
	// or request the operation came from.
	Publish(ctx context.Context, subject string, data JSON) (*Published, error)
	// Presence returns the stream of a presence subscription the executor
	// serves, as Events does.
	Presence(ctx context.Context, subject string) (<-chan *PresenceChange, error)
	// Track and Untrack change the presence of the WebSocket connection
	// the operation came from; Members lists a subject's members with the
	// grants of the connection or request.
	Track(ctx context.Context, subject string, state JSON, resume *string) (*Tracked, error)
	Untrack(ctx context.Context, subject string) (bool, error)
	Members(ctx context.Context, subject string, after *string, limit *int) (*MemberPage, error)
}

// Resolver is the root resolver; Backend answers every field.
type Resolver struct {
	Backend Backend
}
