package receipthttp_test

import (
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"

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
