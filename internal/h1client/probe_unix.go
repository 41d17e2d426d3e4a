//go:build unix

package h1client

import (
	"errors"
	"net"
	"syscall"
)

// closedByPeer reports whether an idle connection can no longer carry a
// request: its server closed it, reset it, or sent bytes nobody asked for.
// One non-blocking peek; a connection that cannot be peeked at is taken
// as open (its next use finds out).
func closedByPeer(nc net.Conn) bool {
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	closed := false
	var b [1]byte
	err = rc.Read(func(fd uintptr) bool {
		_, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		closed = !errors.Is(err, syscall.EAGAIN) && !errors.Is(err, syscall.EWOULDBLOCK)
		return true
	})
	return closed || err != nil
}
