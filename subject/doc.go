// Package subject is fanwire's subject space: the NATS subject syntax that
// the broker, the ingest and the gateway share. It validates subjects and
// patterns ('*' one token, '>' one or more trailing tokens), matches a
// subject against a pattern, tells whether two patterns overlap or one
// contains the other, compares tokens folded for case and width, and holds
// the system-subject rule ($… and _INBOX are the NATS server's, not
// events).
//
// Concurrency: every function is pure and safe for concurrent use. Match,
// MatchEvent, Overlap, Contains, Next and IsSystem allocate nothing; they
// sit on the gateway's dispatch path.
package subject
