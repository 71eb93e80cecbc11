package cdc

import (
	"syscall"
	"unsafe"
)

// socketPending is what socket fd holds unread (TIOCINQ, FIONREAD), or -1.
func socketPending(fd uintptr) int {
	var n int32
	if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, fd, syscall.TIOCINQ, uintptr(unsafe.Pointer(&n))); e != 0 {
		return -1
	}
	return int(n)
}
