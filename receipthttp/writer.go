package receipthttp

import (
	"bufio"
	"bytes"
	"fmt"
	"net"
	"net/http"
)

// writerMode says where a recorder's output goes.
type writerMode uint8

const (
	// buffering: status and body are held until the claim is settled.
	buffering writerMode = iota
	// passThrough: the response went to the client as it was written
	// (the handler flushed, or the body outgrew MaxResponseBytes).
	passThrough
	// hijacked: the handler took over the connection.
	hijacked
)

// recorder is the http.ResponseWriter the handler sees while it executes
// under a claim. It buffers the response so that the receipt is durable
// before the client can see it. The header map is the underlying writer's,
// so a handler holding on to it sees no difference.
type recorder struct {
	under  http.ResponseWriter
	max    int // bytes of body buffered at most
	mode   writerMode
	status int // 0 until WriteHeader or Write
	body   bytes.Buffer
}

var (
	_ http.Flusher  = (*recorder)(nil)
	_ http.Hijacker = (*recorder)(nil)
)

func newRecorder(w http.ResponseWriter, max int) *recorder {
	return &recorder{under: w, max: max}
}

// Header implements http.ResponseWriter.
func (w *recorder) Header() http.Header { return w.under.Header() }

// WriteHeader implements http.ResponseWriter. Informational (1xx) statuses
// are dropped while buffering: they cannot be held back or replayed.
func (w *recorder) WriteHeader(code int) {
	if code < 100 || code > 999 {
		panic(fmt.Sprintf("invalid WriteHeader code %v", code)) // as net/http does
	}
	switch w.mode {
	case passThrough:
		w.under.WriteHeader(code)
		return
	case hijacked:
		return
	}
	if w.status != 0 || code < 200 {
		return
	}
	w.status = code
}

// Write implements http.ResponseWriter.
func (w *recorder) Write(p []byte) (int, error) {
	switch w.mode {
	case passThrough:
		return w.under.Write(p)
	case hijacked:
		return 0, http.ErrHijacked
	}
	if w.status == 0 {
		w.WriteHeader(http.StatusOK)
	}
	if w.body.Len()+len(p) > w.max {
		w.passThrough()
		return w.under.Write(p)
	}
	return w.body.Write(p)
}

// Flush implements http.Flusher. A flush while buffering switches the
// response to pass-through: it can no longer be held back for the receipt.
func (w *recorder) Flush() { _ = w.FlushError() }

// FlushError is Flush reporting the underlying writer's error; it is what
// http.ResponseController calls.
func (w *recorder) FlushError() error {
	switch w.mode {
	case hijacked:
		return http.ErrHijacked
	case buffering:
		w.passThrough()
	}
	return http.NewResponseController(w.under).Flush()
}

// Hijack implements http.Hijacker when the underlying writer supports it;
// otherwise it returns an error wrapping http.ErrNotSupported.
func (w *recorder) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	conn, rw, err := http.NewResponseController(w.under).Hijack()
	if err == nil {
		w.mode = hijacked
		w.body.Reset()
	}
	return conn, rw, err
}

// Unwrap returns the underlying writer, for http.ResponseController's
// other methods (deadlines, full duplex).
func (w *recorder) Unwrap() http.ResponseWriter { return w.under }

// passThrough sends what has been buffered and makes later writes go
// straight to the client.
func (w *recorder) passThrough() {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	w.mode = passThrough
	w.under.WriteHeader(w.status)
	if w.body.Len() > 0 {
		_, _ = w.under.Write(w.body.Bytes())
	}
	w.body = bytes.Buffer{}
}

// finalStatus is the status of a buffered response (200 if none was set).
func (w *recorder) finalStatus() int {
	if w.status == 0 {
		return http.StatusOK
	}
	return w.status
}

// emit sends a buffered response to the client. A response that has gone
// out already (flushed, over the limit, or the connection hijacked) is not
// sent again: a second WriteHeader would make net/http log a superfluous
// call, or a write on a hijacked connection, for every such request.
func (w *recorder) emit(r *http.Request) {
	if w.mode != buffering {
		return
	}
	w.under.WriteHeader(w.finalStatus())
	if w.body.Len() > 0 && r.Method != http.MethodHead {
		_, _ = w.under.Write(w.body.Bytes())
	}
}
