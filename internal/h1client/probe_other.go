//go:build !unix

package h1client

import "net"

// closedByPeer cannot peek here: a closed connection is found at its
// next use.
func closedByPeer(net.Conn) bool { return false }
