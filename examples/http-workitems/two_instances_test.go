package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/receiptstore/receipts/examples/internal/exampledb"
	"github.com/receiptstore/receipts/internal/pgtest"
	"github.com/receiptstore/receipts/internal/transcript"
	"github.com/receiptstore/receipts/receiptstest"
)

// docPath is the page whose transcript TestTwoInstancesTranscript produces.
const docPath = "../../docs/two-instances.md"

// client is the session's HTTP client (curl's part).
type client struct {
	t    *testing.T
	http *http.Client
}

// post sends POST url/v1/work-items as alice with the key.
func (c *client) post(url, key, body string) *http.Response {
	c.t.Helper()
	req, err := http.NewRequest(http.MethodPost, url+"/v1/work-items", strings.NewReader(body))
	if err != nil {
		c.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer alice-token")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	return c.do(req)
}

func (c *client) do(req *http.Request) *http.Response {
	c.t.Helper()
	resp, err := c.http.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		c.t.Fatal(err)
	}
	resp.Body = io.NopCloser(strings.NewReader(string(b)))
	return resp
}

// shownHeaders are the response headers the transcript shows, in order
// (curl -si shows every header; Date and Content-Length change, and the
// others are the point).
var shownHeaders = []string{"Content-Type", "Location", "Served-By", "Retry-After",
	"Idempotent-Replayed", "Idempotency-Recorded-At", "Idempotency-Expires-At"}

// session is a shell session as the page shows it.
type session struct {
	strings.Builder
	replace []string // old, new: the test's addresses and DSN, as the page names them
}

func (tr *session) cmd(line string) { fmt.Fprintf(tr, "$ %s\n", line) }

// response writes what curl -si shows of resp (headers trimmed).
func (tr *session) response(resp *http.Response) {
	fmt.Fprintf(tr, "%s %s\n", resp.Proto, resp.Status)
	for _, name := range shownHeaders {
		if v := resp.Header.Get(name); v != "" {
			fmt.Fprintf(tr, "%s: %s\n", name, v)
		}
	}
	b, _ := io.ReadAll(resp.Body)
	fmt.Fprintf(tr, "\n%s", b)
	if len(b) > 0 && b[len(b)-1] != '\n' {
		tr.WriteString("\n")
	}
}

// String is the session with the test's addresses and DSN replaced.
func (tr *session) String() string {
	return strings.NewReplacer(tr.replace...).Replace(tr.Builder.String())
}

// TestTwoInstancesTranscript runs the session of docs/two-instances.md:
// two instances of the service on two ports share one PostgreSQL database;
// a request to one and its retry to the other (replayed), the same key
// with another body (422), and the proof that the work item and the
// receipt were written by one transaction (their rows' xmin). It fails if
// the page's transcript differs from the session's (ids aside: they come
// from the database's secret); `go test -run TestTwoInstancesTranscript
// -update` writes it.
func TestTwoInstancesTranscript(t *testing.T) {
	dsn := pgtest.Database(t)
	ctx := context.Background()
	clock := receiptstest.NewClock(time.Date(2026, 3, 9, 14, 30, 0, 0, time.UTC))
	var urls []string
	tr := &session{replace: []string{dsn, "$DSN"}}
	tr.cmd(`export DSN=postgres://app@db.internal/app   # or the DSN that -pg alone logs`)
	for i, port := range []string{"8080", "8090"} {
		in, err := start(ctx, config{addr: "127.0.0.1:0", pg: exampledb.PGFlag(dsn), schema: "workitems",
			leaseTTL: 30 * time.Second, log: quiet, now: clock.Now})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := in.stop(); err != nil {
				t.Error(err)
			}
		})
		urls = append(urls, "http://"+in.addrs[0])
		tr.replace = append(tr.replace, in.addrs[0], "127.0.0.1:"+port)
		tr.cmd(fmt.Sprintf(`go run ./examples/http-workitems -pg "$DSN" -addr 127.0.0.1:%s -admin '' &   # instance %c`, port, 'A'+i))
	}
	c := &client{t: t, http: &http.Client{Timeout: 30 * time.Second}}
	curl := func(url, key, body string) *http.Response {
		port := "8080"
		if url == urls[1] {
			port = "8090"
		}
		tr.cmd(fmt.Sprintf(`curl -si localhost:%s/v1/work-items -H 'Authorization: Bearer alice-token' -H 'Idempotency-Key: %s' -d '%s'`, port, key, body))
		resp := c.post(url, key, body)
		tr.response(resp)
		return resp
	}

	tr.WriteString("\n# The request goes to instance A. The work item and the receipt of the response commit in one transaction.\n")
	first := curl(urls[0], "op-1", `{"title":"Write the report","assignee":"bob"}`)
	tr.WriteString("\n# The client's connection dropped before the answer; its retry lands on instance B, which replays it.\n")
	retry := curl(urls[1], "op-1", `{"title":"Write the report","assignee":"bob"}`)
	tr.WriteString("\n# The same key with another body is refused, on either instance.\n")
	reused := curl(urls[1], "op-1", `{"title":"Something else"}`)
	if first.StatusCode != http.StatusCreated || retry.Header.Get("Idempotent-Replayed") != "true" || reused.StatusCode != http.StatusUnprocessableEntity {
		t.Fatalf("the session: %d, %d (replayed %q), %d", first.StatusCode, retry.StatusCode, retry.Header.Get("Idempotent-Replayed"), reused.StatusCode)
	}

	tr.WriteString("\n# One work item, written by the transaction that wrote its receipt (the rows' xmin, the id of the\n# transaction that wrote them, are equal).\n")
	const query = `SELECT w.id, w.xmin = r.xmin AS one_transaction FROM workitems.work_items w, workitems.records r WHERE w.created_by = 'alice' AND r.scope = 'alice' AND r.id = 'op-1'`
	tr.cmd(`psql "$DSN" -Atc "` + query + `"`)
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, query)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for rows.Next() {
		var id string
		var one bool
		if err := rows.Scan(&id, &one); err != nil {
			t.Fatal(err)
		}
		if !one {
			t.Errorf("work item %s and its receipt were written by different transactions", id)
		}
		fmt.Fprintf(tr, "%s|%s\n", id, map[bool]string{true: "t", false: "f"}[one])
		n++
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if n != 1 {
		t.Fatalf("%d work items, want 1", n)
	}

	transcript.Check(t, docPath, "two-instances", tr.String(), normalize)
}
