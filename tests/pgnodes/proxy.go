package pgnodes

import (
	"errors"
	"io"
	"net"
	"sync"
	"time"
)

// Proxy is a TCP proxy on 127.0.0.1 that forwards every accepted connection to one target and
// can cut all live connections at once (Cut), as a network partition or a load balancer
// restart would. New connections are accepted again right after a cut.
type Proxy struct {
	ln     net.Listener
	target string
	delay  time.Duration // added to every byte's way, each direction (NewDelayProxy)

	mu     sync.Mutex
	conns  map[net.Conn]struct{} // live connections, both sides; guarded by mu
	closed bool                  // guarded by mu
	cuts   int                   // connections closed by Cut; guarded by mu

	wg sync.WaitGroup // the accept loop and every copier
}

// NewProxy listens on a free port of 127.0.0.1 and forwards to target (host:port).
func NewProxy(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// NewDelayProxy is NewProxy whose connections carry every byte delay later, in each
// direction, as a link between two sites would (the failover harness streams a standby's WAL
// through one: its replication lag).
func NewDelayProxy(target string, delay time.Duration) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{ln: ln, target: target, delay: delay, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the proxy's listening address (host:port).
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return // closed
		}
		p.wg.Add(1)
		go p.serve(c)
	}
}

// track registers c; it reports false (and closes c) once the proxy is closed.
func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		_ = c.Close()
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
	_ = c.Close()
}

func (p *Proxy) serve(client net.Conn) {
	defer p.wg.Done()
	if !p.track(client) {
		return
	}
	defer p.untrack(client)
	server, err := net.Dial("tcp", p.target)
	if err != nil {
		return
	}
	if !p.track(server) {
		return
	}
	defer p.untrack(server)
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		if p.delay > 0 {
			delayedCopy(dst, src, p.delay)
		} else {
			_, _ = io.Copy(dst, src)
		}
		// One direction ended (EOF, error or cut): end both, so neither side hangs.
		_ = dst.Close()
		_ = src.Close()
		done <- struct{}{}
	}
	go pipe(server, client)
	go pipe(client, server)
	<-done
	<-done
}

// Cut closes every live connection (both sides) and returns how many pairs' sides it closed.
// The proxy keeps accepting.
func (p *Proxy) Cut() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for c := range p.conns {
		_ = c.Close()
		delete(p.conns, c)
		n++
	}
	p.cuts += n
	return n
}

// Live returns the number of live connection sides (two per proxied connection).
func (p *Proxy) Live() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.conns)
}

// Close stops accepting, cuts every connection and waits for the proxy's goroutines.
// A second Close returns nil.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	p.mu.Unlock()
	err := p.ln.Close()
	p.Cut()
	p.wg.Wait()
	if errors.Is(err, net.ErrClosed) {
		err = nil
	}
	return err
}

// delayedCopy copies src to dst, each chunk written delay after it was read, until src ends
// or dst fails.
func delayedCopy(dst, src net.Conn, delay time.Duration) {
	type chunk struct {
		b  []byte
		at time.Time
	}
	ch := make(chan chunk, 1024)
	go func() {
		defer close(ch)
		for {
			b := make([]byte, 32<<10)
			n, err := src.Read(b)
			if n > 0 {
				ch <- chunk{b[:n], time.Now().Add(delay)}
			}
			if err != nil {
				return
			}
		}
	}()
	for c := range ch {
		time.Sleep(time.Until(c.at))
		if _, err := dst.Write(c.b); err != nil {
			_ = src.Close() // ends the reader
			for range ch {
			}
			return
		}
	}
}
