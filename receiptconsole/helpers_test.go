package receiptconsole_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/internal/pgtest"
	"github.com/receiptstore/receipts/pgstore"
	"github.com/receiptstore/receipts/receiptconsole"
	"github.com/receiptstore/receipts/receipthttp"
	"github.com/stretchr/testify/require"
	"golang.org/x/net/html"
)

// TestMain stops the throwaway PostgreSQL cluster, if a test started one, and checks that
// no goroutine outlives the tests.
func TestMain(m *testing.M) { pgtest.Main(pgtest.LeakChecked(m)) }

var bg = context.Background()

// quiet is a logger that drops everything.
var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// engines opens a store on each engine: Pebble on disk, and pgstore on a fresh schema of
// the throwaway cluster.
var engines = []struct {
	name string
	open func(t *testing.T, mod func(*receipts.Options)) *receipts.DB
}{
	{"pebble", openPebble},
	{"postgres", openPG},
}

func storeOptions(mod func(*receipts.Options)) receipts.Options {
	o := receipts.Options{GCInterval: -1, Logger: quiet}
	if mod != nil {
		mod(&o)
	}
	return o
}

func openPebble(t *testing.T, mod func(*receipts.Options)) *receipts.DB {
	t.Helper()
	o := storeOptions(mod)
	db, err := receipts.Open(t.TempDir(), &o)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, db.Close()) })
	return db
}

func openPG(t *testing.T, mod func(*receipts.Options)) *receipts.DB {
	t.Helper()
	dsn, schema := pgtest.Schema(t)
	pool, err := pgxpool.New(bg, dsn)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	db, err := pgstore.Open(bg, pool, &pgstore.Options{Schema: schema, Options: storeOptions(mod)})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, db.Close()) })
	return db
}

// service is an application that serves one action through receipthttp: POST /orders
// creates an order. Its first run answers 500 when fail is set (the outcome is unknown:
// receipthttp abandons the claim), as a service whose provider call timed out.
type service struct {
	srv  *httptest.Server
	runs atomic.Int32
	fail atomic.Bool
}

func newService(t *testing.T, db *receipts.DB) *service {
	t.Helper()
	s := &service{}
	mw, err := receipthttp.New(db, receipthttp.Config{
		Scope: func(r *http.Request) (string, error) { return r.Header.Get("X-Account"), nil },
	})
	require.NoError(t, err)
	s.srv = httptest.NewServer(mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.runs.Add(1)
		if s.fail.Load() {
			http.Error(w, "the provider timed out", http.StatusBadGateway)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, `{"order":"ran"}`)
	})))
	t.Cleanup(s.srv.Close)
	return s
}

// order sends POST /orders as account with key, and returns the status, the body and
// whether it was replayed.
func (s *service) order(t *testing.T, account, key string) (int, string, bool) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, s.srv.URL+"/orders", strings.NewReader(`{"item":"book"}`))
	require.NoError(t, err)
	req.Header.Set("X-Account", account)
	req.Header.Set("Idempotency-Key", `"`+key+`"`)
	req.Header.Set("Content-Type", "application/json")
	resp, err := s.srv.Client().Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b), resp.Header.Get(receipthttp.ReplayedHeader) == "true"
}

// abandonHTTP makes an abandoned claim of account/key through receipthttp: its handler
// answers 502, which leaves the outcome unknown.
func (s *service) abandonHTTP(t *testing.T, account, key string) {
	t.Helper()
	s.fail.Store(true)
	defer s.fail.Store(false)
	status, _, _ := s.order(t, account, key)
	require.Equal(t, http.StatusBadGateway, status)
}

// fixture fills db with one record of each kind the console shows: an abandoned claim of
// receipthttp (alice/op-http), an abandoned claim of the library (bob/op-lib), a live claim
// (bob/op-live, its lease held by the returned lease), and a receipt (carol/op-done, result
// "secret-result").
func fixture(t *testing.T, db *receipts.DB) (*service, *receipts.Lease) {
	t.Helper()
	s := newService(t, db)
	s.abandonHTTP(t, "alice", "op-http")
	l, _, err := db.Claim(bg, receipts.Key{Scope: "bob", ID: "op-lib"}, []byte("fp-lib"))
	require.NoError(t, err)
	require.NoError(t, l.Abandon(bg))
	live, _, err := db.Claim(bg, receipts.Key{Scope: "bob", ID: "op-live"}, []byte("fp-live"), receipts.LeaseFor(time.Hour))
	require.NoError(t, err)
	_, err = db.Do(bg, receipts.Key{Scope: "carol", ID: "op-done"}, []byte("fp-done"), func(context.Context, *receipts.Lease) ([]byte, error) {
		return []byte("secret-result"), nil
	})
	require.NoError(t, err)
	return s, live
}

// consoleServer serves the console of db over real HTTP on loopback.
type consoleServer struct {
	srv    *httptest.Server
	client *http.Client // keeps cookies; does not follow redirects
}

func serveConsole(t *testing.T, db *receipts.DB, opts *receiptconsole.Options) *consoleServer {
	t.Helper()
	mux := http.NewServeMux()
	mux.Handle("/ops/receipts/", receiptconsole.Handler(db, opts))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	jar, err := cookiejar.New(nil)
	require.NoError(t, err)
	c := &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	t.Cleanup(c.CloseIdleConnections)
	return &consoleServer{srv: srv, client: c}
}

func (cs *consoleServer) url(page string) string { return cs.srv.URL + "/ops/receipts/" + page }

// page is a fetched page, parsed.
type page struct {
	status int
	header http.Header
	body   string
	doc    *html.Node
	url    string
}

func (cs *consoleServer) get(t *testing.T, pageURL string) *page {
	t.Helper()
	switch {
	case strings.HasPrefix(pageURL, "/"):
		pageURL = cs.srv.URL + pageURL
	case !strings.HasPrefix(pageURL, "http"):
		pageURL = cs.url(pageURL)
	}
	resp, err := cs.client.Get(pageURL)
	require.NoError(t, err)
	return readPage(t, resp, pageURL)
}

func (cs *consoleServer) post(t *testing.T, pageURL string, form url.Values, header map[string]string) *page {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, cs.url(pageURL), strings.NewReader(form.Encode()))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := cs.client.Do(req)
	require.NoError(t, err)
	return readPage(t, resp, cs.url(pageURL))
}

func readPage(t *testing.T, resp *http.Response, u string) *page {
	t.Helper()
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	p := &page{status: resp.StatusCode, header: resp.Header, body: string(b), url: u}
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/html") {
		p.doc, err = html.Parse(strings.NewReader(p.body))
		require.NoError(t, err)
	}
	return p
}

// walk calls fn for every element of n.
func walk(n *html.Node, fn func(*html.Node)) {
	if n.Type == html.ElementNode {
		fn(n)
	}
	for c := n.FirstChild; c != nil; c = c.NextSibling {
		walk(c, fn)
	}
}

func attr(n *html.Node, name string) string {
	for _, a := range n.Attr {
		if a.Key == name {
			return a.Val
		}
	}
	return ""
}

func hasAttr(n *html.Node, name string) bool {
	for _, a := range n.Attr {
		if a.Key == name {
			return true
		}
	}
	return false
}

func text(n *html.Node) string {
	var b strings.Builder
	var rec func(*html.Node)
	rec = func(n *html.Node) {
		if n.Type == html.TextNode {
			b.WriteString(n.Data)
		}
		for c := n.FirstChild; c != nil; c = c.NextSibling {
			rec(c)
		}
	}
	rec(n)
	return strings.Join(strings.Fields(b.String()), " ")
}

// links returns the href of every link of p whose text is txt.
func (p *page) links(txt string) []string {
	var out []string
	walk(p.doc, func(n *html.Node) {
		if n.Data == "a" && text(n) == txt {
			out = append(out, attr(n, "href"))
		}
	})
	return out
}

// form returns the values of p's form whose action is action (hidden fields and the
// current values of the others), to change and submit.
func (p *page) form(t *testing.T, action string) url.Values {
	t.Helper()
	var found *html.Node
	walk(p.doc, func(n *html.Node) {
		if n.Data == "form" && attr(n, "action") == action && strings.EqualFold(attr(n, "method"), "post") && found == nil {
			found = n
		}
	})
	require.NotNil(t, found, "no POST form to %q on %s:\n%s", action, p.url, p.body)
	v := url.Values{}
	walk(found, func(n *html.Node) {
		name := attr(n, "name")
		if name == "" {
			return
		}
		switch n.Data {
		case "input":
			v.Set(name, attr(n, "value"))
		case "textarea":
			v.Set(name, text(n))
		case "select":
			walk(n, func(o *html.Node) {
				if o.Data == "option" && hasAttr(o, "selected") {
					v.Set(name, attr(o, "value"))
				}
			})
		}
	})
	return v
}

// rowText returns the text of the table row of p that shows cell.
func (p *page) rowText(t *testing.T, cell string) string {
	t.Helper()
	row := ""
	walk(p.doc, func(n *html.Node) {
		if n.Data == "tr" && strings.Contains(text(n), cell) {
			row = text(n)
		}
	})
	require.NotEmpty(t, row, "no table row shows %q on %s", cell, p.url)
	return row
}

// rowLink returns the href of the link txt in the table row of p that shows cell.
func (p *page) rowLink(t *testing.T, cell, txt string) string {
	t.Helper()
	href := ""
	walk(p.doc, func(n *html.Node) {
		if n.Data != "tr" || !strings.Contains(text(n), cell) {
			return
		}
		walk(n, func(a *html.Node) {
			if a.Data == "a" && text(a) == txt {
				href = attr(a, "href")
			}
		})
	})
	require.NotEmpty(t, href, "no %q link in the row of %q on %s", txt, cell, p.url)
	return href
}
