package receiptconsole_test

import (
	"errors"
	"fmt"
	"log"
	"net/http"
	"os"

	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/receiptadmin"
	"github.com/receiptstore/receipts/receiptconsole"
)

// Mount the console on the service's admin listener, beside the JSON admin API, under the
// service's own operator authentication. Without Authorize it would answer loopback only.
func Example() {
	dir, err := os.MkdirTemp("", "receipts-console-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	db, err := receipts.Open(dir, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()

	operator := func(r *http.Request) string { return r.Header.Get("X-Operator") } // set by the SSO proxy
	authorize := func(r *http.Request) error {
		if operator(r) == "" {
			return fmt.Errorf("%w: sign in through the SSO proxy", receiptadmin.ErrUnauthenticated)
		}
		return nil
	}
	mux := http.NewServeMux()
	mux.Handle("/admin/receipts/", receiptadmin.Handler(db, receiptadmin.Authorize(authorize)))
	mux.Handle("/admin/console/", receiptconsole.Handler(db, &receiptconsole.Options{
		Authorize: authorize,
		Operator:  operator,
		ShowResult: func(r *http.Request, rec *receipts.Receipt) error {
			if r.Header.Get("X-Operator-Role") != "support" {
				return errors.New("only support may read results")
			}
			return nil
		},
		ReadOnly: os.Getenv("RECEIPTS_CONSOLE_READ_ONLY") == "true",
	}))
	// http.ListenAndServe("127.0.0.1:8081", mux): open http://127.0.0.1:8081/admin/console/
	fmt.Println("mounted")
	// Output: mounted
}
