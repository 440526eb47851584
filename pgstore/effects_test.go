package pgstore

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/jackc/pgx/v5"

	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/pebblestore"
	"github.com/receiptstore/receipts/receipthttp"
)

// Effects staged on a lease commit with its receipt in one PostgreSQL transaction
// (driver.Effects): both or neither, whatever path records the outcome (Commit, Do, DoTx),
// and an effect for another engine's unit of work writes nothing.
func TestStagedEffects(t *testing.T) {
	d := newTestDB(t)
	db, pool := d.openDB(Options{})
	insert, count := effects(t, pool, d.schema)
	put := func(id string) receipts.Effect {
		return receipts.EffectOn(func(ctx context.Context, tx pgx.Tx) error { return insert(ctx, tx, id) })
	}
	boom := errors.New("boom")
	fp := []byte("fp")
	claim := func(id string) *receipts.Lease {
		t.Helper()
		l, r, err := db.Claim(bg, receipts.Key{Scope: "s", ID: id}, fp)
		if err != nil || r != nil {
			t.Fatalf("claim %s: %+v %v", id, r, err)
		}
		return l
	}

	// Commit: the effect and the receipt, one transaction
	l := claim("commit")
	l.Stage(put("commit"))
	if r, err := l.Commit(bg, []byte("ok")); err != nil || string(r.Result) != "ok" || count() != 1 {
		t.Fatalf("commit with an effect: %+v %v (%d effects)", r, err, count())
	}

	// an effect that fails: nothing written, the lease still held; the next Commit
	// writes the staged effects again
	l = claim("retry")
	l.Stage(put("retry"))
	fail := true
	l.Stage(func(context.Context, any) error {
		if fail {
			return boom
		}
		return nil
	})
	if r, err := l.Commit(bg, []byte("ok")); !errors.Is(err, boom) || r != nil || count() != 1 {
		t.Fatalf("commit with a failing effect: %+v %v (%d effects)", r, err, count())
	}
	if got, err := db.Lookup(bg, l.Key()); err != nil || got.State != receipts.Pending || got.Token != l.Token() {
		t.Fatalf("after the failed commit: %+v %v", got, err)
	}
	fail = false
	if r, err := l.Commit(bg, []byte("ok")); err != nil || r.State != receipts.Succeeded || count() != 2 {
		t.Fatalf("commit again: %+v %v (%d effects)", r, err, count())
	}

	// an effect for Pebble's batch on PostgreSQL: ErrUnsupported, nothing written
	l = claim("pebble")
	l.Stage(receipts.EffectOn(func(context.Context, *pebble.Batch) error { return nil }))
	if _, err := l.Commit(bg, nil); !errors.Is(err, receipts.ErrUnsupported) {
		t.Fatalf("a Pebble effect on PostgreSQL: %v", err)
	}
	if _, err := pebblestore.CommitWith(bg, l, nil, func(*pebble.Batch) error { return nil }); !errors.Is(err, receipts.ErrUnsupported) {
		t.Fatalf("CommitWith on PostgreSQL: %v", err)
	}
	if err := l.Release(bg); err != nil {
		t.Fatal(err)
	}

	// Do: staged effects commit with a Succeeded receipt only
	for _, c := range []struct {
		id      string
		err     error
		effects int
	}{
		{"do-ok", nil, 3},
		{"do-permanent", receipts.Permanent(boom), 3},
		{"do-np", receipts.NotPerformed(boom), 3},
		{"do-unknown", boom, 3},
	} {
		_, err := db.Do(bg, receipts.Key{Scope: "s", ID: c.id}, fp, func(_ context.Context, l *receipts.Lease) ([]byte, error) {
			l.Stage(put(c.id))
			return []byte("r"), c.err
		})
		if (c.err == nil) != (err == nil) || count() != c.effects {
			t.Fatalf("Do %s: %v (%d effects, want %d)", c.id, err, count(), c.effects)
		}
	}

	// DoTx: staged effects run in its transaction, with fn's writes
	r, err := DoTx(bg, db, receipts.Key{Scope: "s", ID: "dotx"}, fp, func(ctx context.Context, tx pgx.Tx, l *receipts.Lease) ([]byte, error) {
		l.Stage(put("dotx-staged"))
		return []byte("r"), insert(ctx, tx, "dotx")
	})
	if err != nil || r.State != receipts.Succeeded || count() != 5 {
		t.Fatalf("DoTx with a staged effect: %+v %v (%d effects)", r, err, count())
	}
	// a staged effect that fails in DoTx: the outcome is unknown, fn's writes roll back, and
	// the claim is left abandoned
	_, err = DoTx(bg, db, receipts.Key{Scope: "s", ID: "dotx-fx"}, fp, func(ctx context.Context, tx pgx.Tx, l *receipts.Lease) ([]byte, error) {
		l.Stage(func(context.Context, any) error { return boom })
		return []byte("r"), insert(ctx, tx, "dotx-fx")
	})
	if !errors.Is(err, receipts.ErrOutcomeUnknown) || !errors.Is(err, boom) || count() != 5 {
		t.Fatalf("DoTx with a failing effect: %v (%d effects)", err, count())
	}
	if got, err := db.Lookup(bg, receipts.Key{Scope: "s", ID: "dotx-fx"}); err != nil || got.State != receipts.Pending || !got.Abandoned(got.UpdatedAt) {
		t.Fatalf("DoTx with a failing effect left %+v %v", got, err)
	}
}

// receipthttp on two pgstore nodes of one schema: the handler's staged effect and the
// stored response commit in one transaction, a retry on the other node is replayed, and
// racing retries on both nodes run the handler once. On main before the effects went
// through the engine seam, the first POST answered 500 (Lease.RunBatch: ErrUnsupported).
func TestReceiptHTTPOnTwoNodes(t *testing.T) {
	d := newTestDB(t)
	a, pool := d.openDB(Options{})
	b, _ := d.openDB(Options{})
	insert, count := effects(t, pool, d.schema)
	var runs atomic.Int32
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		att, ok := receipthttp.AttemptFrom(r.Context())
		if !ok {
			http.Error(w, "no attempt", http.StatusInternalServerError)
			return
		}
		body, _ := io.ReadAll(r.Body)
		att.Stage(receipts.EffectOn(func(ctx context.Context, tx pgx.Tx) error { return insert(ctx, tx, att.Key.ID) }))
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(append([]byte("created "), body...))
	})
	node := func(db *receipts.DB) *httptest.Server {
		mw, err := receipthttp.New(db, receipthttp.Config{Scope: func(*http.Request) (string, error) { return "alice", nil }})
		if err != nil {
			t.Fatal(err)
		}
		s := httptest.NewServer(mw(app))
		t.Cleanup(s.Close)
		return s
	}
	na, nb := node(a), node(b)
	post := func(s *httptest.Server, key, body string) (int, string, http.Header) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, s.URL+"/items", strings.NewReader(body))
		req.Header.Set("Idempotency-Key", `"`+key+`"`)
		resp, err := s.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		got, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(got), resp.Header
	}

	if code, body, _ := post(na, "k1", "x"); code != http.StatusCreated || body != "created x" || count() != 1 {
		t.Fatalf("first POST on node a: %d %q (%d effects)", code, body, count())
	}
	code, body, h := post(nb, "k1", "x")
	if code != http.StatusCreated || body != "created x" || h.Get(receipthttp.ReplayedHeader) != "true" || runs.Load() != 1 || count() != 1 {
		t.Fatalf("retry on node b: %d %q replayed %q (%d runs, %d effects)", code, body, h.Get(receipthttp.ReplayedHeader), runs.Load(), count())
	}
	if code, _, _ := post(nb, "k1", "other body"); code != http.StatusUnprocessableEntity {
		t.Fatalf("same key, other body: %d", code)
	}

	// racing retries of a new key on both nodes: one run, one effect, every answer the same
	var wg sync.WaitGroup
	codes := make([]int, 16)
	for i := range codes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := na
			if i%2 == 1 {
				s = nb
			}
			codes[i], _, _ = post(s, "k2", "y")
		}()
	}
	wg.Wait()
	if runs.Load() != 2 || count() != 2 {
		t.Fatalf("racing retries: %d runs, %d effects (codes %v)", runs.Load(), count(), codes)
	}
	for _, c := range codes {
		if c != http.StatusCreated && c != http.StatusConflict {
			t.Fatalf("racing retries answered %v", codes)
		}
	}
}
