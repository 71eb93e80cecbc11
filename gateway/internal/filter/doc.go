// Package filter is the gateway's row filters: a subscription's "where"
// and a grant's, in CEL (the Common Expression Language, as Kubernetes
// and Envoy use it), evaluated against an event's subject and data and a
// connection's claims. CEL was chosen over a home-made language because
// its Go implementation is maintained, type-checks an expression once,
// and bounds what one evaluation may cost (a runtime cost limit; no loops
// but bounded macros over lists).
//
// An Expr is one text, compiled once per node (Cache) and bounded in cost
// and in the regex programs it holds. A Filter is a grant's and a
// subscription's Expr under a connection's claims; equal filters are one
// value (Set), so the dispatcher evaluates each once per event and shares
// its result. An event's data is parsed once (Parse) for every filter that
// looks at it. A filter that is, or is a conjunction with, an equality of
// a document field to a constant (doc.customer_id == 42, or == claims.sub
// in a grant) carries it as its IndexTerm, for a view index to file it
// under that value.
//
// Concurrency: Cache and Set are safe for concurrent use (each has one
// mutex; the runtime's cleanup goroutine drops their freed entries). An
// Expr, a Parsed and a Filter are immutable once made, except a Filter's
// Seq and OK, which belong to the one goroutine that dispatches events.
// A Bucket is not safe for concurrent use: its owner serializes the calls.
package filter
