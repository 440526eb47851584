package receipthttp_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/receipthttp"
)

// TestReplayHeadersSayWhenAndHowLong: over real HTTP, a replay says when
// the original response was recorded and until when the key is protected
// (HTTP-dates, rounded down to the second), and they do not change as the
// retries go on; the first response carries neither, nor a replay mark.
// Failed receipts (4xx) are replayed with the same headers.
func TestReplayHeadersSayWhenAndHowLong(t *testing.T) {
	for _, status := range []int{http.StatusCreated, http.StatusNotFound} {
		t.Run(http.StatusText(status), func(t *testing.T) {
			app := &counter{status: status}
			e := newEnv(t, receipthttp.Config{}, app)
			srv := httptest.NewServer(e.h)
			defer srv.Close()
			want := status
			post := func() *http.Response {
				t.Helper()
				r, err := http.NewRequest(http.MethodPost, srv.URL+"/items", strings.NewReader("x"))
				if err != nil {
					t.Fatal(err)
				}
				r.Header.Set("X-Caller", "alice")
				r.Header.Set("Idempotency-Key", "k1")
				resp, err := srv.Client().Do(r)
				if err != nil {
					t.Fatal(err)
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != want {
					t.Fatalf("status %d, want %d", resp.StatusCode, want)
				}
				return resp
			}

			e.clk.Advance(1500 * time.Millisecond) // the commit is not on a whole second
			recorded := e.clk.Now()
			first := post()
			for _, h := range []string{receipthttp.ReplayedHeader, receipthttp.RecordedAtHeader, receipthttp.ExpiresAtHeader} {
				if v := first.Header.Get(h); v != "" {
					t.Errorf("first response has %s: %q", h, v)
				}
			}
			rec, err := e.db.Lookup(t.Context(), receipts.Key{Scope: "alice", ID: "k1"})
			if err != nil {
				t.Fatal(err)
			}
			if !rec.UpdatedAt.Equal(recorded) {
				t.Fatalf("receipt recorded at %s, want %s", rec.UpdatedAt, recorded)
			}

			for _, later := range []time.Duration{0, time.Hour, 22 * time.Hour} { // 23h after the recording in all
				e.clk.Advance(later)
				resp := post()
				if got := resp.Header.Get(receipthttp.ReplayedHeader); got != "true" {
					t.Fatalf("%s: %s %q", later, receipthttp.ReplayedHeader, got)
				}
				at, err := http.ParseTime(resp.Header.Get(receipthttp.RecordedAtHeader))
				if err != nil {
					t.Fatalf("%s: %s: %v", later, receipthttp.RecordedAtHeader, err)
				}
				if want := recorded.Truncate(time.Second); !at.Equal(want) {
					t.Errorf("%s: recorded at %s, want %s", later, at, want)
				}
				until, err := http.ParseTime(resp.Header.Get(receipthttp.ExpiresAtHeader))
				if err != nil {
					t.Fatalf("%s: %s: %v", later, receipthttp.ExpiresAtHeader, err)
				}
				if want := recorded.Add(receipts.DefaultRetention).Truncate(time.Second); !until.Equal(want) {
					t.Errorf("%s: protected until %s, want %s (Retention past the recording)", later, until, want)
				}
				if strings.Contains(resp.Header.Get(receipthttp.RecordedAtHeader), "+") || !strings.HasSuffix(resp.Header.Get(receipthttp.ExpiresAtHeader), " GMT") {
					t.Errorf("not IMF-fixdate: %q, %q", resp.Header.Get(receipthttp.RecordedAtHeader), resp.Header.Get(receipthttp.ExpiresAtHeader))
				}
			}
			if n := app.runs.Load(); n != 1 {
				t.Fatalf("handler ran %d times", n)
			}
			// Past Idempotency-Expires-At the key is Gone (a tombstone) for
			// the store's TombstoneWindow: not replayed, and not run again.
			e.clk.Advance(time.Hour)
			want = http.StatusGone
			if resp := post(); resp.Header.Get(receipthttp.ReplayedHeader) != "" {
				t.Fatalf("replayed after %s", receipthttp.ExpiresAtHeader)
			}
			if n := app.runs.Load(); n != 1 {
				t.Fatalf("handler ran %d times, want 1", n)
			}
			// After the window the key is a new request.
			e.clk.Advance(e.db.Options().TombstoneWindow)
			want = status
			if resp := post(); resp.Header.Get(receipthttp.ReplayedHeader) != "" {
				t.Fatalf("replayed after the tombstone window")
			}
			if n := app.runs.Load(); n != 2 {
				t.Fatalf("handler ran %d times, want 2", n)
			}
		})
	}
}
