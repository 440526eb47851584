package receipthttp_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/receipthttp"
)

// BenchmarkMiddleware measures the middleware's cost per request against the
// bare handler: "receipts" is a first request (claim + synced commit, so
// mostly the engine's fsync), "replay" a retry answered from the receipt.
func BenchmarkMiddleware(b *testing.B) {
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"id":"wi_123","title":"write the report"}`)
	})
	const body = `{"title":"write the report"}`
	serve := func(b *testing.B, h http.Handler, key func(i int) string) {
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			r := httptest.NewRequest(http.MethodPost, "/v1/work-items", strings.NewReader(body))
			r.Header.Set("X-Caller", "alice")
			r.Header.Set("Idempotency-Key", key(i))
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			if w.Code != http.StatusCreated {
				b.Fatalf("status %d: %s", w.Code, w.Body)
			}
		}
	}
	b.Run("bare", func(b *testing.B) {
		serve(b, app, strconv.Itoa)
	})
	mw := func(b *testing.B) http.Handler {
		db, err := receipts.Open(b.TempDir(), &receipts.Options{GCInterval: -1})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { db.Close() })
		m, err := receipthttp.New(db, receipthttp.Config{Scope: callerScope})
		if err != nil {
			b.Fatal(err)
		}
		return m(app)
	}
	b.Run("receipts", func(b *testing.B) {
		serve(b, mw(b), strconv.Itoa)
	})
	b.Run("receipts-replay", func(b *testing.B) {
		h := mw(b)
		serve(b, h, func(int) string { return "same" })
	})
}
