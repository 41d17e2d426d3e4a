// Package connlimit bounds the connections a listener holds, in total and per
// source, so that one client opening connections without end cannot take a
// listener from everyone else. A connection over a limit is closed as soon as
// it is accepted, before any byte is read, and counted by the limit that shed
// it.
package connlimit

import (
	"net"
	"net/netip"
	"sync"
)

// Limits bound one listener. A zero field is no limit.
type Limits struct {
	// Total bounds the connections open at once.
	Total int
	// PerSource bounds the connections one source holds: one IPv4 address,
	// or one /64 of IPv6 (a host is routinely given a whole /64).
	PerSource int
	// PerSource48 bounds one /48 of global-unicast IPv6, so a site cannot
	// rotate through its /64s to get around PerSource.
	PerSource48 int
}

// Shed limits, the values of the counters' limit label.
const (
	ShedTotal  = "total"
	ShedSource = "source"
)

// Listener is a net.Listener whose Accept returns only connections within
// its limits.
type Listener struct {
	net.Listener
	lim    Limits
	onShed func(limit string)

	mu        sync.Mutex
	total     int
	perSource map[netip.Prefix]int
}

// New wraps ln. onShed, if not nil, is called with ShedTotal or ShedSource
// for every connection closed for a limit.
func New(ln net.Listener, lim Limits, onShed func(limit string)) *Listener {
	return &Listener{Listener: ln, lim: lim, onShed: onShed, perSource: map[netip.Prefix]int{}}
}

// Accept returns the next connection within the limits. Closing it releases
// its share.
func (l *Listener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			// http.Server pauses on a transient accept error itself.
			return nil, err
		}
		keys := SourceKeys(c.RemoteAddr())
		if limit := l.admit(keys); limit != "" {
			// Counted before the close, so whoever sees the close sees
			// the count.
			if l.onShed != nil {
				l.onShed(limit)
			}
			c.Close()
			continue
		}
		return &conn{Conn: c, l: l, keys: keys}, nil
	}
}

// admit takes a share for a new connection from keys, or names the limit
// that refuses it.
func (l *Listener) admit(keys Keys) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.lim.Total > 0 && l.total >= l.lim.Total {
		return ShedTotal
	}
	if l.lim.PerSource > 0 && l.perSource[keys.Source] >= l.lim.PerSource {
		return ShedSource
	}
	if keys.Wide.IsValid() && l.lim.PerSource48 > 0 && l.perSource[keys.Wide] >= l.lim.PerSource48 {
		return ShedSource
	}
	l.total++
	l.perSource[keys.Source]++
	if keys.Wide.IsValid() {
		l.perSource[keys.Wide]++
	}
	return ""
}

func (l *Listener) release(keys Keys) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.total--
	l.drop(keys.Source)
	if keys.Wide.IsValid() {
		l.drop(keys.Wide)
	}
}

func (l *Listener) drop(k netip.Prefix) {
	if l.perSource[k]--; l.perSource[k] <= 0 {
		delete(l.perSource, k)
	}
}

// Open reports the connections currently held.
func (l *Listener) Open() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.total
}

type conn struct {
	net.Conn
	l    *Listener
	keys Keys
	once sync.Once
}

func (c *conn) Close() error {
	c.once.Do(func() { c.l.release(c.keys) })
	return c.Conn.Close()
}

// Keys are the source groups a connection counts against.
type Keys struct {
	// Source is the address of an IPv4 source, or the /64 of an IPv6 one.
	Source netip.Prefix
	// Wide is the /48 of a global-unicast IPv6 source; invalid otherwise.
	Wide netip.Prefix
}

// SourceKeys groups a remote address: an IPv4 address (IPv4-mapped IPv6
// included) is its own group; an IPv6 address counts against its /64 and,
// when global unicast, its /48. An address that is not TCP or UDP counts
// against one shared group.
func SourceKeys(a net.Addr) Keys {
	var ap netip.AddrPort
	switch a := a.(type) {
	case *net.TCPAddr:
		ap = a.AddrPort()
	case *net.UDPAddr:
		ap = a.AddrPort()
	}
	ip := ap.Addr().Unmap()
	if !ip.IsValid() {
		return Keys{}
	}
	if ip.Is4() {
		return Keys{Source: netip.PrefixFrom(ip, 32)}
	}
	k := Keys{Source: mustPrefix(ip, 64)}
	if ip.IsGlobalUnicast() {
		k.Wide = mustPrefix(ip, 48)
	}
	return k
}

func mustPrefix(ip netip.Addr, bits int) netip.Prefix {
	p, _ := ip.Prefix(bits) // bits never exceeds 128 here
	return p
}
