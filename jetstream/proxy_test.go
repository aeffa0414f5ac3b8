package jetstream_test

import (
	"bytes"
	"io"
	"net"
	"sync"
	"testing"
	"time"
)

// tcpProxy forwards TCP connections to a target address. While paused, it
// keeps reading what clients send but holds it (in order, per connection)
// instead of forwarding it, so a test can inspect what a client has written
// and release it later; the server-to-client direction always flows.
type tcpProxy struct {
	ln     net.Listener
	target string

	mu     sync.Mutex
	cond   *sync.Cond
	paused bool
	closed bool
	links  []*proxyLink
	conns  []net.Conn
	wg     sync.WaitGroup
}

// proxyLink is the client-to-server direction of one proxied connection.
type proxyLink struct {
	to      net.Conn
	pending []byte // read from the client, not yet forwarded
	eof     bool   // the client side ended; close to once pending is out
}

// newTCPProxy listens on a free local port and forwards to target until the
// test ends.
func newTCPProxy(t *testing.T, target string) *tcpProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("proxy listen: %v", err)
	}
	p := &tcpProxy{ln: ln, target: target}
	p.cond = sync.NewCond(&p.mu)
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

// URL is the NATS URL of the proxy.
func (p *tcpProxy) URL() string { return "nats://" + p.ln.Addr().String() }

// Pause holds client-to-server bytes from now on.
func (p *tcpProxy) Pause() {
	p.mu.Lock()
	p.paused = true
	p.mu.Unlock()
}

// Resume forwards what was held and lets bytes flow again.
func (p *tcpProxy) Resume() {
	p.mu.Lock()
	p.paused = false
	p.cond.Broadcast()
	p.mu.Unlock()
}

// Held returns a copy of the client-to-server bytes held now, all
// connections concatenated.
func (p *tcpProxy) Held() []byte {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []byte
	for _, l := range p.links {
		out = append(out, l.pending...)
	}
	return out
}

// WaitHeld waits until cond holds for the held bytes, or fails the test
// after timeout.
func (p *tcpProxy) WaitHeld(t *testing.T, timeout time.Duration, what string, cond func(held []byte) bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	stop := time.AfterFunc(timeout, func() {
		p.mu.Lock()
		p.cond.Broadcast() // wake the waiter below to notice the deadline
		p.mu.Unlock()
	})
	defer stop.Stop()
	p.mu.Lock()
	defer p.mu.Unlock()
	for {
		var held []byte
		for _, l := range p.links {
			held = append(held, l.pending...)
		}
		if cond(held) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("proxy: %s not held after %v; held %d bytes: %q", what, timeout, len(held), truncate(held, 512))
		}
		p.cond.Wait()
	}
}

// truncate shortens b for a failure message.
func truncate(b []byte, n int) []byte {
	if len(b) > n {
		return append(bytes.Clone(b[:n]), "..."...)
	}
	return b
}

func (p *tcpProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		l := &proxyLink{to: s}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			_ = c.Close()
			_ = s.Close()
			return
		}
		p.conns = append(p.conns, c, s)
		p.links = append(p.links, l)
		p.wg.Add(3)
		p.mu.Unlock()
		go func() { // server to client: always flows
			defer p.wg.Done()
			_, _ = io.Copy(c, s)
			_ = c.Close()
		}()
		go p.read(c, l)
		go p.forward(l)
	}
}

// read takes what the client sends into the link's pending bytes.
func (p *tcpProxy) read(c net.Conn, l *proxyLink) {
	defer p.wg.Done()
	buf := make([]byte, 32<<10)
	for {
		n, err := c.Read(buf)
		p.mu.Lock()
		l.pending = append(l.pending, buf[:n]...)
		if err != nil {
			l.eof = true
		}
		p.cond.Broadcast()
		p.mu.Unlock()
		if err != nil {
			return
		}
	}
}

// forward writes the link's pending bytes to the server while not paused.
func (p *tcpProxy) forward(l *proxyLink) {
	defer p.wg.Done()
	for {
		p.mu.Lock()
		for !p.closed && (p.paused || len(l.pending) == 0 && !l.eof) {
			p.cond.Wait()
		}
		if p.closed {
			p.mu.Unlock()
			return
		}
		data, eof := l.pending, l.eof
		l.pending = nil
		p.cond.Broadcast() // Held changed
		p.mu.Unlock()
		if len(data) > 0 {
			if _, err := l.to.Write(data); err != nil {
				_ = l.to.Close()
				return
			}
		}
		if eof {
			_ = l.to.Close()
			return
		}
	}
}

// close stops the proxy and waits for its goroutines.
func (p *tcpProxy) close() {
	p.mu.Lock()
	p.closed = true
	conns := p.conns
	p.cond.Broadcast()
	p.mu.Unlock()
	_ = p.ln.Close()
	for _, c := range conns {
		_ = c.Close()
	}
	p.wg.Wait()
}
