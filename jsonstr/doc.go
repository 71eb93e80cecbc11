// Package jsonstr writes JSON strings the way every fanwire producer
// does, so that the ingest's documents and the gateway's envelopes agree
// byte for byte: quoted, '"' and '\' escaped, \n, \r and \t as such, other
// control characters as \u00XX, and each byte of invalid UTF-8 replaced
// by U+FFFD, written \ufffd: what encoding/json writes, but for the
// escapes it adds for HTML characters, \b, \f and U+2028/U+2029, which
// are copied as is (or written \u0008, \u000c).
//
// It is a leaf package: cdc/pgjson and the gateway use it. Its functions
// are pure and allocate only what they append.
package jsonstr
