package receipthttp_test

import (
	"bytes"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/receipthttp"
)

// lockedBuffer is a bytes.Buffer safe for a slog handler's concurrent writes.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestLogNamesKeyByHash: what the middleware logs about a key (here, a
// response too large to store, which abandons the claim) names it as the
// store does, by its keyed hash, and never by the caller's scope or the
// Idempotency-Key header's value.
func TestLogNamesKeyByHash(t *testing.T) {
	var logs lockedBuffer
	big := strings.Repeat("x", receipts.MaxResultSize) // buffered, but too large once encoded with its status and headers
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(big))
	})
	e := newEnv(t, receipthttp.Config{Logger: slog.New(slog.NewTextHandler(&logs, nil))}, app)
	const caller, id = "caller-secret-scope", "key-secret-id-1234"
	w := e.post(caller, id, "{}")
	if w.Code != http.StatusCreated {
		t.Fatalf("status %d, want the handler's 201 (the response is sent, not stored)", w.Code)
	}
	out := logs.String()
	if !strings.Contains(out, "response too large to store") {
		t.Fatalf("no log of the abandoned claim: %q", out)
	}
	want := e.db.LogKey(receipts.Key{Scope: caller, ID: id})
	if want.Key != "key_hash" || !strings.Contains(out, "key_hash="+want.Value.String()) {
		t.Errorf("log does not name the key by its hash %s: %q", want.Value, out)
	}
	if strings.Contains(out, caller) || strings.Contains(out, id) {
		t.Errorf("log carries the raw scope or key: %q", out)
	}
}
