// Package redact keeps credentials out of what fanwire prints: URL and DSN
// forms are redacted where an error names a server (URL, NATSURL), and a
// Scrubber replaces every known secret, in the forms a library may echo it
// (URL-encoded, decoded, quoted, JSON-escaped), in log lines and start-up
// errors, as a last line of defence against a message fanwire does not
// control (a client library quoting the URL it could not parse).
//
// It is a leaf package: the roles (broker) and the wiring (cmd/fanwire)
// use it. Concurrency: URL, NATSURL and Secrets are pure functions; a
// Scrubber is safe for concurrent use, and its Writer may be shared by
// goroutines as the writer it wraps may.
package redact
