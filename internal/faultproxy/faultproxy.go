// Package faultproxy is a TCP proxy that injects network faults between two
// of Grid's components in end-to-end tests: refused connections, a peer that
// accepts and never answers, one that trickles its answer, a partition that
// drops traffic, a fixed answer in place of the real one, or a slow link
// (a fixed delay each way, as a wide-area round trip). It works below
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
	// Delay forwards both ways, each byte the delay given to SetDelay after
	// it arrived: a link with that one-way latency and no bandwidth limit.
	Delay
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
	delay    time.Duration
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

// SetDelay sets the one-way delay of Delay mode and switches to it.
func (p *Proxy) SetDelay(d time.Duration) {
	p.mu.Lock()
	p.delay = d
	p.mu.Unlock()
	p.Set(Delay)
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
		mode, response, delay := p.mode, p.response, p.delay
		p.open[c] = struct{}{}
		p.mu.Unlock()
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			defer p.forget(c)
			p.serve(c, mode, response, delay)
		}()
	}
}

func (p *Proxy) forget(c net.Conn) {
	c.Close()
	p.mu.Lock()
	delete(p.open, c)
	p.mu.Unlock()
}

func (p *Proxy) serve(c net.Conn, mode Mode, response []byte, delay time.Duration) {
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
	go func() {
		if mode == Delay {
			p.delayed(up, c, delay)
		} else {
			io.Copy(up, c)
		}
		closeWrite(up)
		done <- struct{}{}
	}()
	go func() {
		switch mode {
		case Trickle:
			p.trickle(c, up)
		case Delay:
			p.delayed(c, up, delay)
		default:
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

// delayed copies src to dst, each read written delay after it arrived. A
// reader goroutine stamps what arrives and queues it (at most delayQueue
// reads, so a receiver that stops reading stops the sender, as TCP would);
// this one writes each when its time comes.
func (p *Proxy) delayed(dst, src net.Conn, delay time.Duration) {
	type arrival struct {
		due time.Time
		b   []byte
	}
	queue := make(chan arrival, delayQueue)
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		defer close(queue)
		for {
			b := make([]byte, 32<<10)
			n, err := src.Read(b)
			if n > 0 {
				select {
				case queue <- arrival{due: time.Now().Add(delay), b: b[:n]}:
				case <-stop:
					return
				}
			}
			if err != nil {
				return
			}
		}
	}()
	for a := range queue {
		if wait := time.Until(a.due); wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-t.C:
			case <-p.ctx.Done():
				t.Stop()
				src.Close() // ends the reader
				return
			}
		}
		if _, err := dst.Write(a.b); err != nil {
			src.Close()
			return
		}
	}
}

// delayQueue bounds the reads a Delay link holds in flight per direction.
const delayQueue = 256

// closeWrite passes a half-close on, so the far side sees the end of what
// was sent while its answer can still come back.
func closeWrite(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		tc.CloseWrite()
	}
}
