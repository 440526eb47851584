package receipthttp_test

import (
	"bufio"
	"bytes"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/receiptstore/receipts/receipthttp"
)

// syncBuffer is a bytes.Buffer for a logger written from server goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// A streamed (flushed) or hijacked response has gone out when the handler
// returns: the middleware must not write a status line again. net/http logs
// each such call to the server's ErrorLog ("superfluous response.WriteHeader
// call", "response.WriteHeader on hijacked connection"), once per request,
// which filled the log of a streaming endpoint.
func TestNoSecondStatusLine(t *testing.T) {
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/stream":
			w.Header().Set("Content-Type", "text/event-stream")
			io.WriteString(w, "data: 1\n\n")
			if err := http.NewResponseController(w).Flush(); err != nil {
				t.Errorf("Flush: %v", err)
			}
			io.WriteString(w, "data: 2\n\n")
		case "/flush-first":
			w.WriteHeader(http.StatusAccepted)
			w.(http.Flusher).Flush()
			io.WriteString(w, "later")
		case "/large":
			io.WriteString(w, strings.Repeat("x", 64)) // over MaxResponseBytes
		case "/hijack":
			conn, rw, err := http.NewResponseController(w).Hijack()
			if err != nil {
				t.Errorf("Hijack: %v", err)
				return
			}
			defer conn.Close()
			rw.WriteString("HTTP/1.1 200 OK\r\nContent-Length: 8\r\nConnection: close\r\n\r\nhijacked")
			rw.Flush()
		}
	})
	e := newEnv(t, receipthttp.Config{MaxResponseBytes: 32}, app)
	done := make(chan struct{}, 1)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() { done <- struct{}{} }()
		e.h.ServeHTTP(w, r)
	}))
	var errorLog syncBuffer
	srv.Config.ErrorLog = log.New(&errorLog, "", 0)
	srv.Start()
	defer srv.Close()

	for path, want := range map[string]string{
		"/stream":      "data: 1\n\ndata: 2\n\n",
		"/flush-first": "later",
		"/large":       strings.Repeat("x", 64),
		"/hijack":      "hijacked",
	} {
		r, err := http.NewRequest(http.MethodPost, srv.URL+path, strings.NewReader("x"))
		if err != nil {
			t.Fatal(err)
		}
		r.Header.Set("X-Caller", "alice")
		r.Header.Set("Idempotency-Key", "k"+path)
		resp, err := http.DefaultClient.Do(r)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		body, err := io.ReadAll(bufio.NewReader(resp.Body))
		resp.Body.Close()
		if err != nil || string(body) != want {
			t.Errorf("%s: body %q, %v; want %q", path, body, err, want)
		}
		<-done // the middleware has returned: anything it wrote is logged by now
	}
	if l := errorLog.String(); l != "" {
		t.Fatalf("the server logged:\n%s", l)
	}
}
