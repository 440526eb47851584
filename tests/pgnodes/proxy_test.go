package pgnodes

import (
	"bufio"
	"io"
	"net"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// echoServer accepts connections and echoes every line back, until the test ends.
func echoServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, _ = io.Copy(c, c)
			}()
		}
	}()
	t.Cleanup(func() { _ = ln.Close(); <-done })
	return ln.Addr().String()
}

// leakCheck fails t if goroutines it started outlive it (checked after every cleanup).
func leakCheck(t *testing.T) {
	opts := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, opts) })
}

func roundTrip(t *testing.T, c net.Conn, r *bufio.Reader, msg string) error {
	t.Helper()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, msg+"\n"); err != nil {
		return err
	}
	got, err := r.ReadString('\n')
	if err != nil {
		return err
	}
	if got != msg+"\n" {
		t.Fatalf("echo: got %q, want %q", got, msg)
	}
	return nil
}

// TestProxyForwardsAndCuts: bytes go both ways; Cut closes every live connection (both sides)
// and the proxy accepts new ones right after; Close refuses new ones and stops every goroutine.
func TestProxyForwardsAndCuts(t *testing.T) {
	leakCheck(t)
	p, err := NewProxy(echoServer(t))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()

	var conns []net.Conn
	var readers []*bufio.Reader
	for i := range 3 {
		c, err := net.Dial("tcp", p.Addr())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		r := bufio.NewReader(c)
		if err := roundTrip(t, c, r, "hello"); err != nil {
			t.Fatalf("conn %d: %v", i, err)
		}
		conns, readers = append(conns, c), append(readers, r)
	}
	if n := p.Live(); n != 6 {
		t.Fatalf("live sides: %d, want 6", n)
	}
	if n := p.Cut(); n != 6 {
		t.Fatalf("cut closed %d sides, want 6", n)
	}
	for i, c := range conns {
		if err := roundTrip(t, c, readers[i], "after cut"); err == nil {
			t.Fatalf("conn %d still works after Cut", i)
		} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
			t.Fatalf("conn %d: a cut connection hung instead of failing: %v", i, err)
		}
	}
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	if err := roundTrip(t, c, bufio.NewReader(c), "again"); err != nil {
		t.Fatalf("a new connection after Cut: %v", err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err == nil {
		t.Fatal("a connection survived Close")
	}
	_ = c.Close()
	if c, err := net.DialTimeout("tcp", p.Addr(), time.Second); err == nil {
		c.Close()
		t.Fatal("Close left the proxy accepting")
	}
}

// TestProxyTargetDown: a connection to a target that refuses is closed at once (the client
// sees an error, not a hang), and the proxy keeps serving.
func TestProxyTargetDown(t *testing.T) {
	leakCheck(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close()
	p, err := NewProxy(dead)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err == nil {
		t.Fatal("read through a proxy whose target is down succeeded")
	} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatal("the client hung")
	}
}
