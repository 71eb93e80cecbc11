//go:build !linux

package gateway

// Without epoll, readers never park (package internal/idlepark), and no
// pong is skimmed.
func (c *conn) skimPongs() bool { return false }
