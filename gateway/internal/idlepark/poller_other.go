//go:build !linux

package idlepark

// Without epoll, readers never park: every connection keeps its reader
// goroutine, as it did before parking existed.

// Park reports false: nothing parks.
func (p *Poller) Park(Conn) bool { return false }

// Stop does nothing: no poller runs.
func (p *Poller) Stop() {}
