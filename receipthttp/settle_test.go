package receipthttp_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/receipthttp"
)

// The middleware's keys are recognised from the store alone (Owns), a
// claim of one settled by hand with SettleResponse is replayed by the
// middleware as that response, and a Do key is not taken for one.
func TestOwnsAndSettleResponse(t *testing.T) {
	app := &counter{status: http.StatusInternalServerError} // 5xx: the claim is abandoned
	e := newEnv(t, receipthttp.Config{}, app)
	wantStatus(t, e.post("alice", "op-4", `{"title":"a"}`), http.StatusInternalServerError)
	k := receipts.Key{Scope: "alice", ID: "op-4"}
	r, err := e.db.Lookup(t.Context(), k)
	if err != nil || r.State != receipts.Pending {
		t.Fatalf("Lookup = %+v, %v", r, err)
	}
	if !receipthttp.Owns(r) {
		t.Fatalf("Owns(%x) = false for a key the middleware claimed", r.Fingerprint)
	}
	e.clk.Advance(leaseTTL)
	l, err := e.db.TakeOver(t.Context(), r)
	if err != nil {
		t.Fatal(err)
	}
	for _, status := range []int{409, 429, 500, 503, 101, 0, 600} {
		if _, err := receipthttp.SettleResponse(t.Context(), l, status, nil, nil); !errors.Is(err, receipthttp.ErrInvalidResponse) || !errors.Is(err, receipts.ErrInvalidArgument) {
			t.Fatalf("SettleResponse with status %d: %v, want ErrInvalidResponse", status, err)
		}
	}
	if got, err := e.db.Lookup(t.Context(), k); err != nil || got.State != receipts.Pending || got.Token != l.Token() {
		t.Fatalf("a refused SettleResponse wrote: %+v, %v", got, err)
	}
	h := http.Header{"content-type": {"application/json"}, "Location": {"/items/7"}}
	rec, err := receipthttp.SettleResponse(t.Context(), l, http.StatusCreated, h, []byte(`{"id":7}`))
	if err != nil || rec.State != receipts.Succeeded {
		t.Fatalf("SettleResponse = %+v, %v", rec, err)
	}
	w := e.post("alice", "op-4", `{"title":"a"}`)
	wantStatus(t, w, http.StatusCreated)
	if w.Body.String() != `{"id":7}` || w.Header().Get("Content-Type") != "application/json" ||
		w.Header().Get("Location") != "/items/7" || w.Header().Get(receipthttp.ReplayedHeader) != "true" {
		t.Fatalf("the retry after settling: %d %v %q", w.Code, w.Header(), w.Body)
	}
	if n := app.runs.Load(); n != 1 {
		t.Fatalf("handler ran %d times, want 1", n)
	}

	// A 4xx is stored as Failed, and replayed too.
	app.status = http.StatusInternalServerError
	wantStatus(t, e.post("alice", "op-5", `{}`), http.StatusInternalServerError)
	r, _ = e.db.Lookup(t.Context(), receipts.Key{Scope: "alice", ID: "op-5"})
	e.clk.Advance(leaseTTL)
	if l, err = e.db.TakeOver(t.Context(), r); err != nil {
		t.Fatal(err)
	}
	if rec, err := receipthttp.SettleResponse(t.Context(), l, http.StatusPaymentRequired, nil, []byte("declined")); err != nil || rec.State != receipts.Failed {
		t.Fatalf("SettleResponse 402 = %+v, %v", rec, err)
	}
	w = e.post("alice", "op-5", `{}`)
	if w.Code != http.StatusPaymentRequired || w.Body.String() != "declined" {
		t.Fatalf("the retry after settling 402: %d %q", w.Code, w.Body)
	}

	// A key of Do is not the middleware's.
	do, err := e.db.Do(t.Context(), receipts.Key{Scope: "alice", ID: "do"}, []byte("fp"), func(context.Context, *receipts.Lease) ([]byte, error) { return []byte("x"), nil })
	if err != nil || receipthttp.Owns(do) || receipthttp.Owns(nil) {
		t.Fatalf("Owns of a Do receipt: %v %v", receipthttp.Owns(do), err)
	}
}

// EncodeResponse refuses what cannot be stored, with ErrInvalidResponse.
func TestEncodeResponseRefuses(t *testing.T) {
	many := http.Header{}
	for i := range 65 {
		many.Set("X-H"+strings.Repeat("a", i), "v")
	}
	for name, c := range map[string]struct {
		status int
		h      http.Header
		body   []byte
	}{
		"status 199":     {199, nil, nil},
		"status 600":     {600, nil, nil},
		"header name":    {200, http.Header{"Bad Name": {"v"}}, nil},
		"65 headers":     {200, many, nil},
		"17 values":      {200, http.Header{"X-A": make([]string, 17)}, nil},
		"the same twice": {200, http.Header{"x-a": {"1"}, "X-A": {"2"}}, nil},
		"too large":      {200, nil, make([]byte, receipts.MaxResultSize)},
	} {
		if b, err := receipthttp.EncodeResponse(c.status, c.h, c.body); !errors.Is(err, receipthttp.ErrInvalidResponse) || b != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// A key stored by a receipthttp that did not mark its fingerprints (the raw
// DefaultFingerprint) is still matched: its receipt is replayed, and
// another body still gets 422.
func TestUnmarkedFingerprintStillMatches(t *testing.T) {
	app := &counter{}
	e := newEnv(t, receipthttp.Config{}, app)
	r := req(http.MethodPost, "/items", "alice", "old", `{"title":"a"}`)
	fp, err := receipthttp.DefaultFingerprint(r, []byte(`{"title":"a"}`))
	if err != nil {
		t.Fatal(err)
	}
	k := receipts.Key{Scope: "alice", ID: "old"}
	l, _, err := e.db.Claim(t.Context(), k, fp)
	if err != nil {
		t.Fatal(err)
	}
	stored, err := receipthttp.EncodeResponse(http.StatusCreated, nil, []byte("made before the upgrade"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Commit(t.Context(), stored); err != nil {
		t.Fatal(err)
	}
	w := e.post("alice", "old", `{"title":"a"}`)
	if w.Code != http.StatusCreated || w.Body.String() != "made before the upgrade" || w.Header().Get(receipthttp.ReplayedHeader) != "true" {
		t.Fatalf("retry of an unmarked key: %d %q", w.Code, w.Body)
	}
	wantProblem(t, e.post("alice", "old", `{"title":"b"}`), http.StatusUnprocessableEntity, receipthttp.ProblemKeyReused)
	if n := app.runs.Load(); n != 0 {
		t.Fatalf("handler ran %d times, want 0", n)
	}
	rec, _ := e.db.Lookup(t.Context(), k)
	if receipthttp.Owns(rec) {
		t.Fatal("Owns recognised an unmarked key")
	}
}
