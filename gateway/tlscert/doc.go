// Package tlscert is the listener's certificate for HTTPS and wss://: a
// PEM certificate (chain) and key file pair, served to each handshake and
// loaded again when the files change, so a renewed certificate reaches
// new connections without a restart.
//
// Concurrency: a Files is safe for concurrent use and starts no
// goroutine: the handshake's own goroutine looks at the files (at most
// every check interval) and loads a changed pair under the Files' mutex.
package tlscert
