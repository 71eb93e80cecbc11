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
}

// Resolver is the root resolver; Backend answers every field.
type Resolver struct {
	Backend Backend
}
