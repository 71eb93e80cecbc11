// Package broker connects fanwire's roles to a message broker: NATS Core
// (this file set), and behind the same interface the durable brokers.
//
// Concurrency contract: a Broker is safe for concurrent use. Consume runs its
// delivery loop on the caller's goroutine and calls the handler from it, one
// batch at a time, until its context is cancelled or the broker is closed;
// the handler must not retain the batch slice (it may retain each Message's
// Data, which the broker does not reuse). Close stops a running Consume,
// which returns ErrClosed (TestCloseEndsConsume), and waits for every
// goroutine the broker started. JetStream's Consume also runs one
// goroutine of its own, which re-creates the stream if it is lost; Consume
// returns only after it has stopped.
//
// Credentials and TLS (natsauth.go, redisauth.go) are files named in the
// configs; the Dial functions read and check each before they dial, so a
// bad file is an error at start naming the field, its flag and the file.
// A URL's credentials never appear in an error (redact.go): a URL is named
// with them masked, and a client library's error about a URL that holds
// one is masked too, or, for a URL that does not parse, replaced by a hint.
package broker
