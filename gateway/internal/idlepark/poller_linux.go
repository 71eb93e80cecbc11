//go:build linux

package idlepark

import (
	"syscall"
	"time"
)

// Park hands c's socket to the poller. It reports false when c cannot park
// (no socket descriptor, the socket closed meanwhile, the poller stopped,
// an epoll error): the reader then reads on as before. On true the caller
// must return without touching the connection's read side: a new reader
// may already be running.
func (p *Poller) Park(c Conn) bool {
	pl := c.Place()
	if pl.RC == nil {
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
	if pl.gen == p.gen {
		op = syscall.EPOLL_CTL_MOD // still in this set, disarmed by its last event (one-shot)
	}
	var err error
	// Inside Control the descriptor cannot be closed (and its number
	// reused by another socket) under us; a closed socket fails here.
	if cerr := pl.RC.Control(func(fd uintptr) {
		err = syscall.EpollCtl(p.epfd, op, int(fd), &ev)
		if err == syscall.ENOENT && op == syscall.EPOLL_CTL_MOD {
			err = syscall.EpollCtl(p.epfd, syscall.EPOLL_CTL_ADD, int(fd), &ev)
		} else if err == syscall.EEXIST && op == syscall.EPOLL_CTL_ADD {
			err = syscall.EpollCtl(p.epfd, syscall.EPOLL_CTL_MOD, int(fd), &ev)
		}
	}); cerr != nil || err != nil {
		return false
	}
	pl.gen = p.gen
	pl.id = id
	p.parked[id] = c
	p.parkedGauge(1)
	return true
}

// startLocked creates the epoll set and starts the poller goroutine.
func (p *Poller) startLocked() error {
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
		p.parked = make(map[uint64]Conn)
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
func (p *Poller) run(epfd, wake int) {
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
		var start []Conn
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
				c.Place().id = 0
				p.parkedGauge(-1)
				start = append(start, c)
			}
		}
		idleTimeout := n == 0 && timeout >= 0
		if stop || (idleTimeout && len(p.parked) == 0) {
			p.closeLocked()
			p.mu.Unlock()
			for _, c := range start {
				go c.Woken()
			}
			return
		}
		timeout = -1
		if len(p.parked) == 0 {
			timeout = int(pollerLinger / time.Millisecond)
		}
		p.mu.Unlock()
		for _, c := range start {
			go c.Woken() // owned by the connection: it runs until it parks again or the connection ends
		}
	}
}

// wakeAllLocked starts a reader for every parked connection.
func (p *Poller) wakeAllLocked() {
	for id, c := range p.parked {
		delete(p.parked, id)
		c.Place().id = 0
		p.parkedGauge(-1)
		go c.ReadOn()
	}
}

// closeLocked closes the epoll set; the poller goroutine is exiting.
func (p *Poller) closeLocked() {
	syscall.Close(p.epfd)
	syscall.Close(p.wakeFD)
	p.epfd, p.wakeFD = -1, -1
}

// Stop ends parking for good and waits for the poller goroutine: called
// by the gateway's Shutdown once every connection has ended, so nothing is parked.
func (p *Poller) Stop() {
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
