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
	"time"
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
	// ShedIdle counts idle keep-alive connections closed to make room for
	// a new one when the total is reached.
	ShedIdle = "idle"
)

// Listener is a net.Listener whose Accept returns only connections within
// its limits.
type Listener struct {
	net.Listener
	onShed func(limit string)

	// mu guards everything below; Accept, Close of a connection, SetLimits
	// and SetIdle may run on any goroutine.
	mu        sync.Mutex
	lim       Limits
	total     int
	perSource map[netip.Prefix]int
	// idle holds the connections the server reported idle (SetIdle), with
	// when they became so: the first to close when the total is reached.
	idle map[*conn]time.Time
}

// New wraps ln. onShed, if not nil, is called with ShedTotal, ShedSource or
// ShedIdle for every connection closed for a limit.
func New(ln net.Listener, lim Limits, onShed func(limit string)) *Listener {
	return &Listener{Listener: ln, lim: lim, onShed: onShed, perSource: map[netip.Prefix]int{}, idle: map[*conn]time.Time{}}
}

// SetLimits changes the limits for connections accepted from now on; held
// connections over a lowered limit stay until they close.
func (l *Listener) SetLimits(lim Limits) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lim = lim
}

// SetIdle records whether c, a connection this listener returned, waits
// idle between requests (an http.Server's ConnState hook reports it). When
// the total is reached, the connection idle the longest is closed to admit
// a new one, rather than turning the new one away: an idle keep-alive
// costs its client one reconnect, a refused connection costs a request.
// c may be a layer over the connection (a TLS one) that returns it from
// NetConn.
func (l *Listener) SetIdle(c net.Conn, idle bool) {
	cc, ok := c.(*conn)
	for !ok {
		layer, isLayer := c.(interface{ NetConn() net.Conn })
		if !isLayer {
			return
		}
		c = layer.NetConn()
		cc, ok = c.(*conn)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, open := l.idle[cc]; idle && !cc.closed {
		if !open {
			l.idle[cc] = time.Now()
		}
		return
	}
	delete(l.idle, cc)
}

// evictIdle closes the connection idle the longest, and reports whether
// there was one.
func (l *Listener) evictIdle() bool {
	l.mu.Lock()
	var oldest *conn
	for c, since := range l.idle {
		if oldest == nil || since.Before(l.idle[oldest]) {
			oldest = c
		}
	}
	if oldest != nil {
		delete(l.idle, oldest)
	}
	l.mu.Unlock()
	if oldest == nil {
		return false
	}
	if l.onShed != nil {
		l.onShed(ShedIdle)
	}
	oldest.Close()
	return true
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
		limit := l.admit(keys)
		if limit == ShedTotal && l.evictIdle() {
			limit = l.admit(keys)
		}
		if limit != "" {
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

func (l *Listener) release(c *conn) {
	l.mu.Lock()
	defer l.mu.Unlock()
	c.closed = true
	delete(l.idle, c)
	keys := c.keys
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
	// closed is set under l.mu once the connection released its share.
	closed bool
}

func (c *conn) Close() error {
	c.once.Do(func() { c.l.release(c) })
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
