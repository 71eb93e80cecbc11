// Package auth is who a gateway client is and what it may do: Grants (the
// patterns a connection may subscribe to, with their row filters, publish
// to and track presence on, until an expiry), the Authenticator a gateway
// calls for each connection, and JWTAuth, which makes Grants from a JSON
// Web Token signed with a shared secret (HS256) or a key of a JWKS
// (RS256, ES256), its claims substituted into the patterns.
//
// Concurrency: Grants are immutable once made; a connection replaces
// them on a token refresh. JWTAuth is safe for concurrent use: the
// goroutine verifying a token checks the key files (at most every
// KeyCheckInterval) and loads changed ones under the key store's mutex;
// it starts no goroutine of its own.
package auth
