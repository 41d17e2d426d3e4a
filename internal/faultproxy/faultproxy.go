// Package faultproxy is a TCP proxy that injects network faults between two
// of Grid's components in end-to-end tests: refused connections, a peer that
// accepts and never answers, one that trickles its answer, a partition that
// drops traffic, or a fixed answer in place of the real one. It works below
// TLS, so mutual TLS and identity checks run unchanged through it.
package faultproxy

import (
	"context"
	"io"
	"net"
	"sync"
	"time"
)

// Mode is what the proxy does with connections.
type Mode int

const (
	// Pass forwards both ways.
	Pass Mode = iota
	// Refuse closes every connection as soon as it is accepted: the
	// component behind is gone.
	Refuse
	// Blackhole accepts and reads, and never forwards or answers: a peer
	// that hangs, or a partition that drops packets.
	Blackhole
	// Trickle forwards the request, and the answer one byte per
	// TrickleEvery.
	Trickle
	// Respond answers every connection with the bytes given to SetResponse,
	// whatever it asks, then closes it.
	Respond
)

// TrickleEvery is the pause between bytes in Trickle mode.
const TrickleEvery = 200 * time.Millisecond

// Proxy forwards connections from its listener to a target address.
type Proxy struct {
	ln     net.Listener
	target string
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu       sync.Mutex
	mode     Mode
	response []byte
	open     map[net.Conn]struct{}
}

// Start listens on a free loopback port and forwards to target.
func Start(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Proxy{ln: ln, target: target, ctx: ctx, cancel: cancel, open: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the address components should dial instead of the target.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Set changes the mode. Open connections are cut, so that a connection
// kept alive from before cannot carry traffic around the new fault (or keep
// an old fault after it heals).
func (p *Proxy) Set(m Mode) {
	p.mu.Lock()
	p.mode = m
	open := p.open
	p.open = map[net.Conn]struct{}{}
	p.mu.Unlock()
	for c := range open {
		c.Close()
	}
}

// SetResponse sets the answer of Respond mode and switches to it.
func (p *Proxy) SetResponse(raw []byte) {
	p.mu.Lock()
	p.response = raw
	p.mu.Unlock()
	p.Set(Respond)
}

// Close stops the proxy and every connection through it.
func (p *Proxy) Close() error {
	p.cancel()
	err := p.ln.Close()
	p.Set(Pass)
	p.wg.Wait()
	return err
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		mode, response := p.mode, p.response
		p.open[c] = struct{}{}
		p.mu.Unlock()
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			defer p.forget(c)
			p.serve(c, mode, response)
		}()
	}
}

func (p *Proxy) forget(c net.Conn) {
	c.Close()
	p.mu.Lock()
	delete(p.open, c)
	p.mu.Unlock()
}

func (p *Proxy) serve(c net.Conn, mode Mode, response []byte) {
	switch mode {
	case Refuse:
		return
	case Blackhole:
		io.Copy(io.Discard, c) // until the client gives up or Set cuts it
		return
	case Respond:
		// Read what arrives first, so the client is not answered before it
		// has written, then answer and close.
		c.SetReadDeadline(time.Now().Add(time.Second))
		c.Read(make([]byte, 64<<10))
		c.Write(response)
		return
	}
	var d net.Dialer
	up, err := d.DialContext(p.ctx, "tcp", p.target)
	if err != nil {
		return
	}
	p.mu.Lock()
	p.open[up] = struct{}{}
	p.mu.Unlock()
	defer p.forget(up)
	done := make(chan struct{}, 2)
	go func() { io.Copy(up, c); closeWrite(up); done <- struct{}{} }()
	go func() {
		if mode == Trickle {
			p.trickle(c, up)
		} else {
			io.Copy(c, up)
		}
		closeWrite(c)
		done <- struct{}{}
	}()
	<-done
	<-done
}

// trickle copies src to dst one byte per TrickleEvery.
func (p *Proxy) trickle(dst, src net.Conn) {
	b := make([]byte, 1)
	for {
		if _, err := io.ReadFull(src, b); err != nil {
			return
		}
		if _, err := dst.Write(b); err != nil {
			return
		}
		select {
		case <-time.After(TrickleEvery):
		case <-p.ctx.Done():
			return
		}
	}
}

// closeWrite passes a half-close on, so the far side sees the end of what
// was sent while its answer can still come back.
func closeWrite(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		tc.CloseWrite()
	}
}
