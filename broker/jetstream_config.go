package broker

import "time"

// JetStreamConfig configures the JetStream broker: a NATS connection (as for
// Core NATS) and the stream that captures the subject space.
type JetStreamConfig struct {
	NATSConfig
	Stream   string        // stream name (default "FANWIRE")
	MaxAge   time.Duration // retention by age (0: unlimited)
	MaxBytes int64         // retention by size (0: unlimited)
	Storage  string        // "file" (default) or "memory"
	Replicas int           // stream replicas, 3 on a cluster (0: an existing stream keeps its own, a new one gets 1)
	// Duplicates is the least deduplication window for publish ids
	// (default 2m): a stream whose window is longer (an operator's choice)
	// keeps it.
	Duplicates time.Duration
	// OnGap is called with the number of events the live feed skipped
	// because they were removed from the stream before it read them (a
	// long outage outlived retention): they cannot be delivered, so they
	// are counted.
	OnGap func(n int)
}
