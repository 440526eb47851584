package receiptconsole_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/receiptadmin"
	"github.com/receiptstore/receipts/receiptconsole"
	"github.com/receiptstore/receipts/receiptstest"
	"github.com/stretchr/testify/require"
	"golang.org/x/net/html"
)

// checkPage checks what every page must be: served with the security headers, in a
// language, every form field labelled, ids unique, every form that changes something a
// POST with the CSRF token, every button named, every table with header cells, and no key
// in any link other than by its sealed reference.
func checkPage(t *testing.T, p *page, readOnly bool) {
	t.Helper()
	require.NotNil(t, p.doc, "%s: not HTML (%d): %s", p.url, p.status, p.body)
	csp := p.header.Get("Content-Security-Policy")
	for _, d := range []string{"default-src 'none'", "frame-ancestors 'none'", "form-action 'self'", "base-uri 'none'"} {
		require.Contains(t, csp, d, "%s: CSP", p.url)
	}
	require.Equal(t, "nosniff", p.header.Get("X-Content-Type-Options"), p.url)
	require.Equal(t, "no-store", p.header.Get("Cache-Control"), p.url)
	require.Equal(t, "no-referrer", p.header.Get("Referrer-Policy"), p.url)

	ids := map[string]bool{}
	labels := map[string]bool{}
	var fields []*html.Node
	walk(p.doc, func(n *html.Node) {
		if id := attr(n, "id"); id != "" {
			require.False(t, ids[id], "%s: id %q twice", p.url, id)
			ids[id] = true
		}
		switch n.Data {
		case "html":
			require.NotEmpty(t, attr(n, "lang"), "%s: <html> without lang", p.url)
		case "label":
			labels[attr(n, "for")] = true
		case "input", "select", "textarea":
			if attr(n, "type") != "hidden" {
				fields = append(fields, n)
			}
		case "button":
			require.NotEmpty(t, text(n), "%s: a button without text", p.url)
		case "table":
			th := false
			walk(n, func(c *html.Node) { th = th || c.Data == "th" })
			require.True(t, th, "%s: a table without header cells", p.url)
		case "form":
			method := strings.ToLower(attr(n, "method"))
			csrf := false
			walk(n, func(c *html.Node) { csrf = csrf || (c.Data == "input" && attr(c, "name") == "csrf") })
			switch method {
			case "post":
				require.False(t, readOnly, "%s: a POST form in read-only mode", p.url)
				require.True(t, csrf, "%s: a POST form without the CSRF token", p.url)
			case "get":
				require.Contains(t, []string{"key", "erase", "needs"}, attr(n, "action"), "%s: a GET form that is not a lookup", p.url)
				require.False(t, csrf, "%s: a GET form carries the CSRF token (it would land in the URL)", p.url)
			default:
				t.Fatalf("%s: a form without method GET or POST", p.url)
			}
		case "a":
			href := attr(n, "href")
			u, err := url.Parse(href)
			require.NoError(t, err)
			for _, secret := range []string{"op-http", "op-lib", "op-live", "op-done", "secret-result"} {
				require.NotContains(t, u.RawQuery, secret, "%s: a link names a key or a result: %s", p.url, href)
			}
		}
	})
	for _, f := range fields {
		id := attr(f, "id")
		require.True(t, id != "" && labels[id] || attr(f, "aria-label") != "", "%s: <%s name=%q> has no label", p.url, f.Data, attr(f, "name"))
	}
}

// Every page the console serves passes checkPage on both engines, in both modes; the pages
// show what they are for.
func TestPages(t *testing.T) {
	for _, e := range engines {
		t.Run(e.name, func(t *testing.T) {
			db := e.open(t, nil)
			fixture(t, db)
			for _, readOnly := range []bool{false, true} {
				cs := serveConsole(t, db, &receiptconsole.Options{ReadOnly: readOnly, Logger: quiet})
				over := cs.get(t, "")
				require.Equal(t, http.StatusOK, over.status, over.body)
				checkPage(t, over, readOnly)
				require.Contains(t, text(over.doc), "2 unknown outcomes waiting")
				require.Contains(t, text(over.doc), "Engine: "+e.name)
				if e.name == "postgres" { // what survives a failover, from DB.EngineMetrics
					for m, v := range map[string]string{"sync_standby_up": "0 (check)", "synchronous_commit": "3",
						"commit_check": "0 (check)", "require_sync_standby": "0"} {
						require.Contains(t, over.body, "<code>receipts_postgres_"+m+"</code></th><td>"+v+"</td>")
					}
				}

				needs := cs.get(t, "needs")
				checkPage(t, needs, readOnly)
				require.Contains(t, needs.body, "op-http")
				require.Contains(t, needs.body, "op-lib")
				require.NotContains(t, needs.body, "op-live", "a live claim does not need a person")
				require.Contains(t, text(needs.doc), "HTTP (receipthttp)")
				require.Contains(t, text(needs.doc), "library")
				require.Contains(t, needs.body, db.ProviderKey(receipts.Key{Scope: "alice", ID: "op-http"}))
				opens := needs.links("Open")
				require.Len(t, opens, 2)
				settles := needs.links("Settle")
				if readOnly {
					require.Empty(t, settles)
				} else {
					require.Len(t, settles, 2)
				}

				typed := cs.get(t, "key?scope=carol&id=op-done")
				checkPage(t, typed, readOnly)
				require.Contains(t, text(typed.doc), "succeeded")
				require.NotContains(t, typed.body, "secret-result", "a result without ShowResult")
				require.Contains(t, text(typed.doc), "hidden")

				for _, href := range opens {
					k := cs.get(t, href)
					require.Equal(t, http.StatusOK, k.status, k.body)
					checkPage(t, k, readOnly)
					require.Contains(t, text(k.doc), "abandoned")
				}
				for _, href := range settles {
					s := cs.get(t, href)
					require.Equal(t, http.StatusOK, s.status, s.body)
					checkPage(t, s, readOnly)
					require.Contains(t, text(s.doc), "What a retry gets")
				}
				for _, u := range []string{"key", "key?scope=nobody&id=x", "erase", "erase?scope=bob", "nosuchpage"} {
					checkPage(t, cs.get(t, u), readOnly)
				}
				if !readOnly {
					require.Contains(t, text(cs.get(t, "erase?scope=bob").doc), "2 records of this scope would be deleted")
				}
			}
		})
	}
}

// The console refuses what it must, and changes nothing then: a cross-site POST
// (CrossOriginProtection, by Sec-Fetch-Site or by Origin), a POST without the form's
// token, a GET that would change something, any change in read-only mode.
func TestRefusals(t *testing.T) {
	db := openPebble(t, nil)
	fixture(t, db)
	cs := serveConsole(t, db, &receiptconsole.Options{Logger: quiet})
	needs := cs.get(t, "needs")
	var cookie *http.Cookie
	for _, ck := range (&http.Response{Header: needs.header}).Cookies() {
		cookie = ck
	}
	require.NotNil(t, cookie, "the first page sets the CSRF cookie")
	require.True(t, cookie.HttpOnly)
	require.Equal(t, http.SameSiteStrictMode, cookie.SameSite)
	require.Equal(t, "/ops/receipts/", cookie.Path)

	// A link's reference from another console (or a forged one) names no key here.
	other := serveConsole(t, db, &receiptconsole.Options{Logger: quiet})
	theirs := other.get(t, "needs").rowLink(t, "op-http", "Open")
	require.Equal(t, http.StatusOK, other.get(t, theirs).status)
	for _, u := range []string{strings.TrimPrefix(theirs, "key"), "?k=AAAA"} {
		p := cs.get(t, "key"+u)
		require.Equal(t, http.StatusBadRequest, p.status, u)
		require.Contains(t, text(p.doc), "not valid here")
	}

	form := cs.get(t, needs.rowLink(t, "op-http", "Settle")).form(t, "settle")
	form.Set("outcome", "not_performed")
	form.Set("confirm", "op-http")
	before := abandoned(t, db)

	for name, h := range map[string]map[string]string{
		"Sec-Fetch-Site cross-site": {"Sec-Fetch-Site": "cross-site"},
		"Sec-Fetch-Site same-site":  {"Sec-Fetch-Site": "same-site"},
		"Origin of another host":    {"Origin": "https://evil.example"},
	} {
		p := cs.post(t, "settle", form, h)
		require.Equal(t, http.StatusForbidden, p.status, name)
		require.Contains(t, p.body, "cross-site", name)
		require.Equal(t, before, abandoned(t, db), name)
	}

	noToken := url.Values{}
	for k, v := range form {
		if k != "csrf" {
			noToken[k] = v
		}
	}
	p := cs.post(t, "settle", noToken, nil)
	require.Equal(t, http.StatusForbidden, p.status)
	require.Contains(t, p.body, "token")
	wrong := url.Values{}
	for k, v := range form {
		wrong[k] = v
	}
	wrong.Set("csrf", "AAAA")
	require.Equal(t, http.StatusForbidden, cs.post(t, "settle", wrong, nil).status)
	require.Equal(t, before, abandoned(t, db))

	// Another browser (its own cookie) cannot use this one's token.
	browser2 := serveConsoleClient(t, cs)
	require.Equal(t, http.StatusForbidden, browser2.post(t, "settle", form, nil).status)
	require.Equal(t, before, abandoned(t, db))

	// A form larger than a result can be is refused before it is read.
	huge := url.Values{}
	for k, v := range form {
		huge[k] = v
	}
	huge.Set("body", strings.Repeat("x", 3<<20))
	p = cs.post(t, "settle", huge, nil)
	require.Equal(t, http.StatusBadRequest, p.status)
	require.Equal(t, before, abandoned(t, db))

	// Reading never changes anything: POST only on the pages that change.
	require.Equal(t, http.StatusMethodNotAllowed, cs.post(t, "needs", form, nil).status)

	// Read-only: the same form, with its token, is refused.
	ro := serveConsole(t, db, &receiptconsole.Options{ReadOnly: true, Logger: quiet})
	ro.client.Jar = cs.client.Jar
	p = ro.post(t, "settle", form, nil)
	require.Equal(t, http.StatusForbidden, p.status)
	require.Contains(t, p.body, "read-only")
	p = ro.post(t, "erase", url.Values{"scope": {"bob"}, "confirm": {"bob"}, "csrf": form["csrf"]}, nil)
	require.Equal(t, http.StatusForbidden, p.status)
	require.Equal(t, before, abandoned(t, db))

	// The same POST from the page's own origin goes through.
	p = cs.post(t, "settle", form, map[string]string{"Sec-Fetch-Site": "same-origin"})
	require.Equal(t, http.StatusSeeOther, p.status, p.body)
	require.Len(t, abandoned(t, db), len(before)-1)
}

// serveConsoleClient is a second browser on cs's console: no cookies.
func serveConsoleClient(t *testing.T, cs *consoleServer) *consoleServer {
	t.Helper()
	c := *cs
	c.client = &http.Client{CheckRedirect: cs.client.CheckRedirect}
	return &c
}

// abandoned lists the keys of db's abandoned claims.
func abandoned(t *testing.T, db *receipts.DB) []string {
	t.Helper()
	var out []string
	for r, err := range db.Scan(bg, receipts.Filter{Abandoned: true}) {
		require.NoError(t, err)
		out = append(out, r.Key.String())
	}
	return out
}

// Without an Authorize hook the console serves loopback only: a request from elsewhere
// gets 403 and nothing of the store, not even the stylesheet. With a hook, the hook
// decides, wherever the request comes from.
func TestAuthorization(t *testing.T) {
	db := openPebble(t, nil)
	fixture(t, db)
	serve := func(h http.Handler, remote, path string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodGet, path, nil)
		req.RemoteAddr = remote
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		return w
	}
	h := receiptconsole.Handler(db, &receiptconsole.Options{Logger: quiet})
	for _, path := range []string{"/", "/needs", "/key?scope=carol&id=op-done", "/style.css", "/erase"} {
		w := serve(h, "203.0.113.7:4242", path)
		require.Equal(t, http.StatusForbidden, w.Code, path)
		require.Contains(t, w.Body.String(), "loopback only")
		require.NotContains(t, w.Body.String(), "op-", path)
		require.NotEmpty(t, w.Header().Get("Content-Security-Policy"))
	}
	require.Equal(t, http.StatusOK, serve(h, "127.0.0.1:4242", "/").Code)
	require.Equal(t, http.StatusOK, serve(h, "[::1]:4242", "/needs").Code)

	hook := func(r *http.Request) error {
		switch r.Header.Get("X-Operator") {
		case "":
			return receiptadmin.ErrUnauthenticated
		case "mallory":
			return errors.New("mallory may not operate receipts")
		}
		return nil
	}
	h = receiptconsole.Handler(db, &receiptconsole.Options{Authorize: hook, Logger: quiet})
	w := serve(h, "127.0.0.1:1", "/")
	require.Equal(t, http.StatusUnauthorized, w.Code, "the hook decides on loopback too")
	require.NotEmpty(t, w.Header().Get("WWW-Authenticate"))
	req := httptest.NewRequest(http.MethodGet, "/needs", nil)
	req.RemoteAddr = "203.0.113.7:4242"
	req.Header.Set("X-Operator", "mallory")
	w = httptest.NewRecorder()
	h.ServeHTTP(w, req)
	require.Equal(t, http.StatusForbidden, w.Code)
	require.NotContains(t, w.Body.String(), "op-http")
	req.Header.Set("X-Operator", "oscar")
	w = httptest.NewRecorder()
	h.ServeHTTP(w, req)
	require.Equal(t, http.StatusOK, w.Code)
	require.Contains(t, w.Body.String(), "op-http")
}

// A result is shown only when ShowResult allows it for that receipt.
func TestResultShownOnlyWhenAllowed(t *testing.T) {
	db := openPebble(t, nil)
	fixture(t, db)
	_, err := db.Do(bg, receipts.Key{Scope: "dave", ID: "op-2"}, []byte("fp"), func(context.Context, *receipts.Lease) ([]byte, error) {
		return []byte("dave-result"), nil
	})
	require.NoError(t, err)
	cs := serveConsole(t, db, &receiptconsole.Options{Logger: quiet, ShowResult: func(_ *http.Request, r *receipts.Receipt) error {
		if r.Key.Scope != "carol" {
			return errors.New("this operator may not see " + r.Key.Scope + "'s results")
		}
		return nil
	}})
	require.Contains(t, cs.get(t, "key?scope=carol&id=op-done").body, "secret-result")
	p := cs.get(t, "key?scope=dave&id=op-2")
	require.NotContains(t, p.body, "dave-result")
	require.Contains(t, text(p.doc), "may not see dave")
}

// Settling through the console: bad input is answered on the page and changes nothing;
// a confirmed settlement is a 303 to the key's page, logged with who made it, and a real
// retry through receipthttp gets the settled response without running the handler again.
func TestSettleHTTPFace(t *testing.T) {
	for _, e := range engines {
		t.Run(e.name, func(t *testing.T) {
			db := e.open(t, nil)
			svc, _ := fixture(t, db)
			var log bytes.Buffer
			cs := serveConsole(t, db, &receiptconsole.Options{Logger: slog.New(slog.NewTextHandler(&log, nil)),
				Operator: func(*http.Request) string { return "oscar" }})
			sp := cs.get(t, cs.get(t, "needs").rowLink(t, "op-http", "Settle"))
			form := sp.form(t, "settle")
			require.Equal(t, "http", form.Get("outcome"), "a receipthttp key is settled with a response")
			before := abandoned(t, db)

			for _, c := range []struct {
				set  map[string]string
				want string
			}{
				{map[string]string{"status": "201", "confirm": "op-wrong"}, "type the key's ID exactly"},
				{map[string]string{"status": "502", "confirm": "op-http"}, "no outcome"},
				{map[string]string{"status": "409", "confirm": "op-http"}, "declined"},
				{map[string]string{"status": "abc", "confirm": "op-http"}, "not a number"},
				{map[string]string{"status": "201", "headers": "no colon here", "confirm": "op-http"}, "Name: value"},
				{map[string]string{"outcome": "succeeded", "confirm": "op-http"}, "not one of this key's outcomes"},
			} {
				f := url.Values{}
				for k, v := range form {
					f[k] = v
				}
				for k, v := range c.set {
					f.Set(k, v)
				}
				p := cs.post(t, "settle", f, nil)
				require.Equal(t, http.StatusBadRequest, p.status, "%v: %s", c.set, p.body)
				require.Contains(t, text(p.doc), c.want, c.set)
				require.Contains(t, text(p.doc), "Nothing changed")
				checkPage(t, p, false)
				require.Equal(t, before, abandoned(t, db), "%v changed something", c.set)
			}

			form.Set("status", "201")
			form.Set("headers", "Content-Type: application/json")
			form.Set("body", `{"order":"settled"}`)
			form.Set("confirm", "op-http")
			p := cs.post(t, "settle", form, nil)
			require.Equal(t, http.StatusSeeOther, p.status, p.body)
			loc := p.header.Get("Location")
			require.NotContains(t, loc, "op-http", "the redirect names no key")
			k := cs.get(t, p.header.Get("Location"))
			require.Contains(t, text(k.doc), "Settled")
			require.Contains(t, text(k.doc), "succeeded")
			require.Contains(t, log.String(), "operator=oscar")
			require.Contains(t, log.String(), "settled=succeeded")
			require.NotContains(t, log.String(), "op-http", "the log names keys by their hash")

			runs := svc.runs.Load()
			status, body, replayed := svc.order(t, "alice", "op-http")
			require.Equal(t, http.StatusCreated, status)
			require.JSONEq(t, `{"order":"settled"}`, body)
			require.True(t, replayed)
			require.Equal(t, runs, svc.runs.Load(), "the retry ran the handler again")

			// The same form again: the claim is settled, nothing to do.
			p = cs.post(t, "settle", form, nil)
			require.Equal(t, http.StatusConflict, p.status)
			require.Contains(t, p.body, "already settled")
		})
	}
}

// A library key is settled as NotPerformed: the key is free, and the next call runs.
func TestSettleNotPerformed(t *testing.T) {
	db := openPebble(t, nil)
	fixture(t, db)
	cs := serveConsole(t, db, &receiptconsole.Options{Logger: quiet})
	form := cs.get(t, cs.get(t, "needs").rowLink(t, "op-lib", "Settle")).form(t, "settle")
	require.Equal(t, "succeeded", form.Get("outcome"))
	form.Set("outcome", "not_performed")
	form.Set("confirm", "op-lib")
	p := cs.post(t, "settle", form, nil)
	require.Equal(t, http.StatusSeeOther, p.status, p.body)
	require.Contains(t, text(cs.get(t, p.header.Get("Location")).doc), "the key is free")
	ran := false
	_, err := db.Do(bg, receipts.Key{Scope: "bob", ID: "op-lib"}, []byte("fp-lib"), func(_ context.Context, l *receipts.Lease) ([]byte, error) {
		ran = true
		return nil, nil
	})
	require.NoError(t, err)
	require.True(t, ran)
}

// Erasure: a preview counts the scope's records; a confirmation that does not name the
// scope changes nothing; the named one erases it, and the ledger shows its keyed hash,
// never the scope.
func TestErase(t *testing.T) {
	for _, e := range engines {
		t.Run(e.name, func(t *testing.T) {
			db := e.open(t, nil)
			_, live := fixture(t, db)
			require.NoError(t, live.Release(bg))
			var log bytes.Buffer
			cs := serveConsole(t, db, &receiptconsole.Options{Logger: slog.New(slog.NewTextHandler(&log, nil))})
			p := cs.get(t, "erase?scope=bob")
			require.Contains(t, text(p.doc), "1 record of this scope would be deleted")
			form := p.form(t, "erase")
			form.Set("confirm", "carol")
			p = cs.post(t, "erase", form, nil)
			require.Equal(t, http.StatusBadRequest, p.status)
			require.Contains(t, text(p.doc), "Nothing changed")
			_, err := db.Inspect(bg, receipts.Key{Scope: "bob", ID: "op-lib"})
			require.NoError(t, err)

			form.Set("confirm", "bob")
			p = cs.post(t, "erase", form, nil)
			require.Equal(t, http.StatusSeeOther, p.status, p.body)
			ledger := cs.get(t, p.header.Get("Location"))
			require.Contains(t, text(ledger.doc), "Erased")
			require.Contains(t, ledger.body, strings.ToLower(hexString(db.ScopeID("bob"))))
			require.Contains(t, text(ledger.doc), "(in force)")
			_, err = db.Inspect(bg, receipts.Key{Scope: "bob", ID: "op-lib"})
			require.ErrorIs(t, err, receipts.ErrNotFound)
			gone := cs.get(t, "key?scope=bob&id=op-lib")
			require.Contains(t, text(gone.doc), "the key's scope was erased")
			require.Contains(t, text(gone.doc), "refused as erased")
			require.Contains(t, log.String(), "erased a scope")
			require.NotContains(t, log.String(), "bob")
			require.Contains(t, text(cs.get(t, "").doc), "1 erasure in force")
		})
	}
}

func hexString(b []byte) string {
	const digits = "0123456789abcdef"
	out := make([]byte, 0, 2*len(b))
	for _, c := range b {
		out = append(out, digits[c>>4], digits[c&15])
	}
	return string(out)
}

// Needs a person filters by scope, face and age; a bulk action forgets what the filter
// selects after the operator types how many the preview counted, and changes nothing if
// the count typed is not the count now.
func TestBulkForget(t *testing.T) {
	for _, e := range engines {
		t.Run(e.name, func(t *testing.T) {
			db := e.open(t, nil)
			fixture(t, db)
			for _, id := range []string{"z-1", "z-2", "z-3"} {
				l, _, err := db.Claim(bg, receipts.Key{Scope: "zed", ID: id}, []byte("fp"))
				require.NoError(t, err)
				require.NoError(t, l.Abandon(bg))
			}
			cs := serveConsole(t, db, &receiptconsole.Options{Logger: quiet})
			require.Contains(t, text(cs.get(t, "needs?face=http").doc), "1 abandoned claim")
			require.Contains(t, text(cs.get(t, "needs?face=library").doc), "4 abandoned claims")
			require.Contains(t, text(cs.get(t, "needs?older=1h").doc), "No abandoned claims")
			bad := cs.get(t, "needs?older=soon")
			require.Equal(t, http.StatusBadRequest, bad.status)
			require.Contains(t, text(bad.doc), "not a duration")

			p := cs.get(t, "needs?scope=zed")
			checkPage(t, p, false)
			require.Contains(t, text(p.doc), "Forget the 3 claims below as not performed?")
			form := p.form(t, "bulk")
			form.Set("confirm", "2")
			p = cs.post(t, "bulk", form, nil)
			require.Equal(t, http.StatusBadRequest, p.status)
			require.Contains(t, text(p.doc), "3 now. Nothing changed.")
			require.Len(t, abandoned(t, db), 5)

			// A retry takes one over after the preview: the count typed is stale.
			l, _, err := db.Claim(bg, receipts.Key{Scope: "zed", ID: "z-2"}, []byte("fp"), receipts.LeaseFor(time.Hour))
			require.NoError(t, err)
			require.True(t, l.Recovered())
			form.Set("confirm", "3")
			require.Equal(t, http.StatusBadRequest, cs.post(t, "bulk", form, nil).status)
			require.Len(t, abandoned(t, db), 4)

			form.Set("confirm", "2")
			p = cs.post(t, "bulk", form, nil)
			require.Equal(t, http.StatusSeeOther, p.status, p.body)
			require.Contains(t, text(cs.get(t, p.header.Get("Location")).doc), "Forgotten as not performed: 2 claims")
			require.ElementsMatch(t, []string{`"alice"/"op-http"`, `"bob"/"op-lib"`}, abandoned(t, db))
			_, err = db.Inspect(bg, receipts.Key{Scope: "zed", ID: "z-1"})
			require.ErrorIs(t, err, receipts.ErrNotFound)
			r, err := db.Inspect(bg, receipts.Key{Scope: "zed", ID: "z-2"})
			require.NoError(t, err)
			require.Equal(t, l.Token(), r.Token, "the claim taken over after the preview was left alone")
		})
	}
}

// Under Options.HashKeys the lists show keys as hashes (quoted: they start with "\x00h"),
// the key an operator types shows as typed, and a hashed claim is settled from its listing
// with its hash as the confirmation: a real retry with the raw key then gets the answer.
func TestHashedKeys(t *testing.T) {
	db := openPebble(t, func(o *receipts.Options) { o.HashKeys = true })
	svc, _ := fixture(t, db)
	cs := serveConsole(t, db, &receiptconsole.Options{Logger: quiet})
	needs := cs.get(t, "needs")
	checkPage(t, needs, false)
	require.NotContains(t, needs.body, "op-http")
	require.NotContains(t, needs.body, "alice")
	require.Contains(t, text(needs.doc), `"\x00h`)
	require.Contains(t, text(needs.doc), "keyed hashes")
	require.Contains(t, text(cs.get(t, "needs?scope=alice").doc), "1 abandoned claim", "a filter's raw scope finds its hashed claims")

	typed := cs.get(t, "key?scope=alice&id=op-http")
	require.Contains(t, text(typed.doc), "alice / op-http")
	require.Contains(t, text(typed.doc), "abandoned")

	// Settle the HTTP claim from the list: its ID shows hashed, and that is the confirmation.
	var href string
	walk(needs.doc, func(n *html.Node) {
		if n.Data == "tr" && strings.Contains(text(n), "HTTP (receipthttp)") {
			walk(n, func(a *html.Node) {
				if a.Data == "a" && text(a) == "Settle" {
					href = attr(a, "href")
				}
			})
		}
	})
	sp := cs.get(t, href)
	var confirm string
	walk(sp.doc, func(n *html.Node) {
		if n.Data == "label" && attr(n, "for") == "confirm" {
			walk(n, func(c *html.Node) {
				if c.Data == "code" {
					confirm = text(c)
				}
			})
		}
	})
	require.True(t, strings.HasPrefix(confirm, `"\x00h`), confirm)
	form := sp.form(t, "settle")
	form.Set("status", "201")
	form.Set("body", `{"order":"settled"}`)
	form.Set("confirm", confirm)
	p := cs.post(t, "settle", form, nil)
	require.Equal(t, http.StatusSeeOther, p.status, p.body)
	status, body, replayed := svc.order(t, "alice", "op-http")
	require.Equal(t, http.StatusCreated, status)
	require.Equal(t, `{"order":"settled"}`, body)
	require.True(t, replayed)
}

// One key tells a receipt, its tombstone after retention, and a key never used apart, and
// says what a retry of each gets.
func TestKeyLifecycle(t *testing.T) {
	clock := receiptstest.NewClock(time.Now())
	db := openPebble(t, func(o *receipts.Options) { o.Now = clock.Now; o.Retention = time.Hour; o.LeaseTTL = time.Minute })
	_, err := db.Do(bg, receipts.Key{Scope: "carol", ID: "op-old"}, []byte("fp"), func(context.Context, *receipts.Lease) ([]byte, error) {
		return []byte("r"), nil
	})
	require.NoError(t, err)
	cs := serveConsole(t, db, &receiptconsole.Options{Logger: quiet})
	p := cs.get(t, "key?scope=carol&id=op-old")
	require.Contains(t, text(p.doc), "the stored result, as a success")
	require.Contains(t, text(p.doc), "retries are refused until")
	clock.Advance(2 * time.Hour)
	p = cs.get(t, "key?scope=carol&id=op-old")
	require.Equal(t, http.StatusOK, p.status)
	require.Contains(t, text(p.doc), "the key's tombstone is in force")
	require.Contains(t, text(p.doc), "HTTP 410 Gone")
	p = cs.get(t, "key?scope=carol&id=op-new")
	require.Contains(t, text(p.doc), "No record of this key")
	require.Contains(t, text(p.doc), "the key is free")
	p = cs.get(t, "key?scope=carol&id="+strings.Repeat("x", 300))
	require.Equal(t, http.StatusBadRequest, p.status)
	checkPage(t, p, false)
}
