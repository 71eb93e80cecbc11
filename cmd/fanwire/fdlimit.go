package main

import (
	"fmt"
	"syscall"

	"go.uber.org/zap"
)

// fdReserve is the file descriptors a ws node keeps for other than client
// sockets: broker connections (and their reconnects), listeners, the
// debug and metrics endpoints, certificate and key files read on reload.
const fdReserve = 256

// fitFileLimit fits --max-connections and --max-handshakes into the
// process's file descriptor limit (RLIMIT_NOFILE; the Go runtime has
// already raised its soft limit to the hard one). Every connection, and
// every accepted socket still in its handshake, is a descriptor. Past the
// limit accept(2) fails with EMFILE: net/http then backs off for up to a
// second at a time while new clients wait in the kernel's backlog, and the
// broker cannot reconnect. Fitted, the node answers those clients with
// 503 and Retry-After instead (reason max_connections), and keeps
// fdReserve descriptors for itself. It logs what it changed and why.
func fitFileLimit(log *zap.Logger, maxConns, maxHandshakes int) (int, int) {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		log.Warn("cannot read the file descriptor limit: --max-connections is not checked against it", zap.Error(err))
		return maxConns, maxHandshakes
	}
	conns, hs, ok := fitFDs(rl.Cur, maxConns, maxHandshakes)
	if !ok {
		log.Warn(fmt.Sprintf("the file descriptor limit (%d) is below --max-connections + --max-handshakes + %d reserved: lowered to fit, raise the limit (LimitNOFILE= in a systemd unit, --ulimit nofile= for docker run, ulimit -n) for more",
			rl.Cur, fdReserve),
			zap.Uint64("nofile", rl.Cur),
			zap.Int("max_connections", conns), zap.Int("max_connections_flag", maxConns),
			zap.Int("max_handshakes", hs), zap.Int("max_handshakes_flag", maxHandshakes))
	}
	return conns, hs
}

// fitFDs lowers maxConns and maxHandshakes (0 or less: no handshake cap)
// so that together with fdReserve they fit limit descriptors, and reports
// whether they already did. Handshakes keep at most a tenth of the room:
// they are short-lived, connections are what the node is for.
func fitFDs(limit uint64, maxConns, maxHandshakes int) (conns, handshakes int, ok bool) {
	room := int64(limit) - fdReserve
	if limit > 1<<40 { // RLIM_INFINITY and the like: nothing to fit
		return maxConns, maxHandshakes, true
	}
	hs := int64(maxHandshakes)
	if hs <= 0 {
		hs = room // no cap: any number may be pending
	}
	if int64(maxConns)+hs <= room {
		return maxConns, maxHandshakes, true
	}
	room = max(room, 2)
	handshakes = int(min(hs, max(room/10, 1)))
	conns = int(min(int64(maxConns), room-int64(handshakes)))
	return max(conns, 1), handshakes, false
}
