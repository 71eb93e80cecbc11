//go:build !linux

package gateway

// Without epoll, readers never park: every connection keeps its reader
// goroutine, as it did before parking existed.

func (p *idlePoller) park(*conn) bool { return false }

func (p *idlePoller) stop() {}

func (c *conn) skimPongs() bool { return false }
