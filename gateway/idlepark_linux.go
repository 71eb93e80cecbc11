//go:build linux

package gateway

import (
	"syscall"
	"time"
)

// park hands c's socket to the poller. It reports false when c cannot park
// (no socket descriptor, the socket closed meanwhile, the poller stopped,
// an epoll error): the reader then reads on as before. On true the caller
// must return without touching the connection's read side: a new reader
// may already be running.
func (p *idlePoller) park(c *conn) bool {
	if c.park.rc == nil {
		return false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stopped {
		return false
	}
	if p.epfd < 0 {
		if err := p.startLocked(); err != nil {
			return false
		}
	}
	p.nextID++
	id := p.nextID
	ev := syscall.EpollEvent{Events: syscall.EPOLLIN | syscall.EPOLLRDHUP | syscall.EPOLLONESHOT}
	ev.Fd, ev.Pad = int32(uint32(id)), int32(uint32(id>>32))
	op := syscall.EPOLL_CTL_ADD
	if c.park.gen == p.gen {
		op = syscall.EPOLL_CTL_MOD // still in this set, disarmed by its last event (one-shot)
	}
	var err error
	// Inside Control the descriptor cannot be closed (and its number
	// reused by another socket) under us; a closed socket fails here.
	if cerr := c.park.rc.Control(func(fd uintptr) {
		err = syscall.EpollCtl(p.epfd, op, int(fd), &ev)
		if err == syscall.ENOENT && op == syscall.EPOLL_CTL_MOD {
			err = syscall.EpollCtl(p.epfd, syscall.EPOLL_CTL_ADD, int(fd), &ev)
		} else if err == syscall.EEXIST && op == syscall.EPOLL_CTL_ADD {
			err = syscall.EpollCtl(p.epfd, syscall.EPOLL_CTL_MOD, int(fd), &ev)
		}
	}); cerr != nil || err != nil {
		return false
	}
	c.park.gen = p.gen
	c.park.id = id
	p.parked[id] = c
	p.parkedGauge(1)
	return true
}

// startLocked creates the epoll set and starts the poller goroutine.
func (p *idlePoller) startLocked() error {
	epfd, err := syscall.EpollCreate1(syscall.EPOLL_CLOEXEC)
	if err != nil {
		return err
	}
	wake, _, errno := syscall.Syscall(syscall.SYS_EVENTFD2, 0, syscall.O_CLOEXEC|syscall.O_NONBLOCK, 0)
	if errno != 0 {
		syscall.Close(epfd)
		return errno
	}
	ev := syscall.EpollEvent{Events: syscall.EPOLLIN} // id 0: the stop signal
	if err := syscall.EpollCtl(epfd, syscall.EPOLL_CTL_ADD, int(wake), &ev); err != nil {
		syscall.Close(epfd)
		syscall.Close(int(wake))
		return err
	}
	if p.parked == nil {
		p.parked = make(map[uint64]*conn)
	}
	p.epfd, p.wakeFD = epfd, int(wake)
	p.gen++
	p.wg.Add(1)
	go p.run(epfd, p.wakeFD)
	return nil
}

// run waits for parked sockets to become readable and starts their
// readers. It exits once no socket has been parked for pollerLinger, or
// when stop signals it, closing the epoll set.
func (p *idlePoller) run(epfd, wake int) {
	defer p.wg.Done()
	events := make([]syscall.EpollEvent, 256)
	timeout := -1
	for {
		n, err := syscall.EpollWait(epfd, events, timeout)
		if err != nil && err != syscall.EINTR {
			// Not expected with valid descriptors: give every parked
			// reader back its goroutine rather than strand it.
			p.mu.Lock()
			p.wakeAllLocked()
			p.closeLocked()
			p.mu.Unlock()
			return
		}
		var start []*conn
		stop := false
		p.mu.Lock()
		for _, ev := range events[:max(n, 0)] {
			id := uint64(uint32(ev.Fd)) | uint64(uint32(ev.Pad))<<32
			if id == 0 {
				stop = true
				continue
			}
			if c := p.parked[id]; c != nil {
				delete(p.parked, id)
				c.park.id = 0
				p.parkedGauge(-1)
				start = append(start, c)
			}
		}
		idleTimeout := n == 0 && timeout >= 0
		if stop || (idleTimeout && len(p.parked) == 0) {
			p.closeLocked()
			p.mu.Unlock()
			for _, c := range start {
				go c.woken()
			}
			return
		}
		timeout = -1
		if len(p.parked) == 0 {
			timeout = int(pollerLinger / time.Millisecond)
		}
		p.mu.Unlock()
		for _, c := range start {
			go c.woken() // owned by the connection: it runs until it parks again or the connection ends
		}
	}
}

// wakeAllLocked starts a reader for every parked connection.
func (p *idlePoller) wakeAllLocked() {
	for id, c := range p.parked {
		delete(p.parked, id)
		c.park.id = 0
		p.parkedGauge(-1)
		go c.read(false)
	}
}

// closeLocked closes the epoll set; the poller goroutine is exiting.
func (p *idlePoller) closeLocked() {
	syscall.Close(p.epfd)
	syscall.Close(p.wakeFD)
	p.epfd, p.wakeFD = -1, -1
}

// stop ends parking for good and waits for the poller goroutine: called
// by Shutdown once every connection has ended, so nothing is parked.
func (p *idlePoller) stop() {
	p.mu.Lock()
	p.stopped = true
	p.wakeAllLocked() // none expected: a safety net, not a path
	if p.epfd >= 0 {
		one := [8]byte{1}
		_, _ = syscall.Write(p.wakeFD, one[:])
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// skimPongs takes whole pong frames off the front of a woken reader's
// socket, hands each to onPong, and reports whether the socket is empty
// afterwards (the reader may park again). Anything else (a data or close
// frame, a ping, a frame not all there yet, an EOF) is left for the
// library, whose reader is empty (parking checked), so the stream stays
// whole: only complete frames are taken, at a frame boundary.
func (c *conn) skimPongs() bool {
	var peek, got [2 + 4 + 125]byte // a pong's header, mask key and largest payload
	for {
		n, err := c.recv(peek[:], syscall.MSG_PEEK)
		if err == syscall.EAGAIN {
			return true // nothing there (any more)
		}
		if err != nil || n < 2 {
			return false // EOF, an error, or a header still arriving: the library's
		}
		b0, b1 := peek[0], peek[1]
		plen := int(b1 & 0x7f)
		// FIN, no RSV bits, opcode pong; masked (a client's), a short payload.
		if b0 != 0x8a || b1&0x80 == 0 || plen > 125 || n < 6+plen {
			return false
		}
		flen := 6 + plen
		m, err := c.recv(got[:flen], 0)
		if err != nil || m != flen || string(got[:flen]) != string(peek[:flen]) {
			// Someone else read the socket meanwhile (a close handshake):
			// the stream is no longer whole.
			c.closeNow()
			return false
		}
		key, payload := got[2:6], got[6:flen]
		for i := range payload {
			payload[i] ^= key[i&3]
		}
		c.onPong(payload)
	}
}

// recv reads from the socket without waiting (MSG_DONTWAIT), with flags.
func (c *conn) recv(p []byte, flags int) (n int, err error) {
	if cerr := c.park.rc.Read(func(fd uintptr) bool {
		n, _, err = syscall.Recvfrom(int(fd), p, flags|syscall.MSG_DONTWAIT)
		return true // never wait
	}); cerr != nil {
		return 0, cerr
	}
	return n, err
}
