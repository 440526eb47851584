package receipthttp_test

import (
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"

	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/receipthttp"
)

func ExampleNew() {
	dir, err := os.MkdirTemp("", "receipthttp-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	db, err := receipts.Open(dir, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()

	idempotent, err := receipthttp.New(db, receipthttp.Config{
		// The authenticated caller owns its keys; a real service reads its
		// auth middleware's result here.
		Scope: func(r *http.Request) (string, error) {
			if user, _, ok := r.BasicAuth(); ok {
				return user, nil
			}
			return "", errors.New("not signed in")
		},
		Required: true,
	})
	if err != nil {
		log.Fatal(err)
	}
	runs := 0
	h := idempotent(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs++
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"id":"wi_1"}`)
	}))

	call := func(key, body string) {
		r := httptest.NewRequest(http.MethodPost, "/v1/work-items", strings.NewReader(body))
		r.SetBasicAuth("alice", "secret")
		if key != "" {
			r.Header.Set("Idempotency-Key", key)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		fmt.Println(w.Code, w.Header().Get("Idempotent-Replayed"), strings.TrimSpace(w.Body.String()))
	}
	call("op-1", `{"title":"a"}`) // runs the handler
	call("op-1", `{"title":"a"}`) // a retry: replayed
	call("op-1", `{"title":"b"}`) // same key, other payload
	call("", `{"title":"a"}`)     // no key
	fmt.Println("handler runs:", runs)
	// Output:
	// 201  {"id":"wi_1"}
	// 201 true {"id":"wi_1"}
	// 422  {"type":"tag:receiptstore.github.io,2026:receipthttp/key-reused","title":"Idempotency-Key reused with a different request","status":422,"detail":"this key was used for a request with another method, path or body"}
	// 400  {"type":"tag:receiptstore.github.io,2026:receipthttp/key-missing","title":"Missing Idempotency-Key header","status":400,"detail":"this operation requires an Idempotency-Key header"}
	// handler runs: 1
}

// fencedTable stands for a downstream system (a table in another database):
// each row keeps the largest fencing token that wrote it, and a write with
// a token that is not larger changes nothing. In SQL:
//
//	UPDATE work_items SET title = $1, fence = $2 WHERE id = $3 AND fence < $2
type fencedTable struct {
	mu   sync.Mutex
	rows map[string]fencedRow
}

type fencedRow struct {
	title string
	fence uint64
}

// write sets row id to title if token is larger than the row's fence, and
// reports whether it did.
func (t *fencedTable) write(id, title string, token uint64) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.rows[id].fence >= token {
		return false // a newer attempt has written: this one is stale
	}
	t.rows[id] = fencedRow{title: title, fence: token}
	return true
}

// A handler fences its writes to another system with Attempt.Token: the
// first attempt writes and then fails with a 5xx (its outcome is unknown,
// so its claim is abandoned); the retry takes the claim over with a larger
// token and writes again; when the first attempt's write arrives late, it
// changes nothing.
func ExampleAttempt() {
	dir, err := os.MkdirTemp("", "receipthttp-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	db, err := receipts.Open(dir, &receipts.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	idempotent, err := receipthttp.New(db, receipthttp.Config{
		Scope: func(*http.Request) (string, error) { return "alice", nil },
	})
	if err != nil {
		log.Fatal(err)
	}

	table := &fencedTable{rows: map[string]fencedRow{}}
	var late func() bool // the first attempt's write, delivered late
	h := idempotent(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a, _ := receipthttp.AttemptFrom(r.Context())
		title := fmt.Sprintf("written by attempt %d", a.Number)
		if !table.write("wi_1", title, a.Token) {
			http.Error(w, "stale attempt", http.StatusConflict)
			return
		}
		if a.Number == 1 {
			late = func() bool { return table.write("wi_1", "late write of attempt 1", a.Token) }
			http.Error(w, "upstream timed out", http.StatusBadGateway) // outcome unknown
			return
		}
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "recovered=%v", a.Recovered)
	}))

	for range 2 {
		r := httptest.NewRequest(http.MethodPost, "/v1/work-items", strings.NewReader(`{}`))
		r.Header.Set("Idempotency-Key", "op-1")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		fmt.Println(w.Code, strings.TrimSpace(w.Body.String()))
	}
	fmt.Println("late write applied:", late())
	fmt.Println("row:", table.rows["wi_1"].title)
	// Output:
	// 502 upstream timed out
	// 201 recovered=true
	// late write applied: false
	// row: written by attempt 2
}
