// Package receiptconsole is the operators' console of a receipts store: web pages, mounted
// in the application's own server beside the JSON admin API (package receiptadmin), for
// the moments that need a person. It shows the store's state as its metrics read it, the
// abandoned claims whose outcome is unknown (oldest first), one key's record, and the
// erasure ledger; and it settles an abandoned claim in its front end's form (an HTTP
// response, a tool result, or the library's result), forgets one that did not happen,
// settles the uncertain step of an action of several steps (done, failed or not done: the
// next retry resumes the action), and erases a scope. `receiptctl console --dir DIR` (or --pg DSN) serves it offline.
//
// The pages are server-rendered HTML (html/template) with one stylesheet and no script.
// The handler works on every engine (Pebble, pgstore), through the DB's operator methods
// (Inspect, Scan, Count, Stats, EngineMetrics, TakeOver, EraseScope, Erasures).
//
// # Security
//
// The console can change outcomes, so:
//   - it serves loopback only unless Options.Authorize is given, with receiptadmin's rule
//     (receiptadmin.Allowed): nothing is served, not even the stylesheet, that the hook did
//     not allow;
//   - reading is GET; every change is a POST answered by a redirect (303), refused across
//     sites by net/http.CrossOriginProtection and without the form's CSRF token (a keyed
//     hash of a SameSite=Strict cookie), and each needs a typed confirmation: the key's ID
//     to settle it, the step's name to settle a step, the scope to erase it. Every change is logged (Options.Logger) with who
//     made it (Options.Operator);
//   - no URL holds a key or a result, except the key an operator typed into the lookup
//     form: links to a key carry an opaque reference sealed under Options.Secret;
//   - every answer carries a Content-Security-Policy (default-src 'none'; style-src 'self';
//     form-action 'self'; frame-ancestors 'none'; base-uri 'none'), nosniff, no-store and
//     no-referrer;
//   - a stored result is shown only if Options.ShowResult allows it for that receipt, as
//     Options.BeforeReplay does for replays: by default results are hidden;
//   - Options.ReadOnly hides every action and refuses every change.
//
// Bad input (an unknown key, a status receipthttp does not store, a confirmation that does
// not match) is answered on the page with what was wrong, and nothing changes.
//
// # Settling without the pages
//
// Settle is what the Settle page does, as a function: `receiptctl reconcile SCOPE ID` uses
// it too, so both settle a claim the same way (fenced by the listed attempt's token, in the
// form of the front end that claimed the key).
package receiptconsole

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"path"
	"strings"

	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/receiptadmin"
)

// Options configures the console. The zero value serves loopback only, hides results, and
// allows changes.
type Options struct {
	// Authorize is asked about every request, as receiptadmin.Authorize is: nil lets it
	// through; an error refuses it (401 if it wraps receiptadmin.ErrUnauthenticated, else
	// 403). Without it the console serves loopback only (receiptadmin.Allowed).
	Authorize func(r *http.Request) error
	// Operator names who made a request, for the log of every change. Default: the
	// request's remote address.
	Operator func(r *http.Request) string
	// ShowResult decides whether the stored result of rec may be shown to the operator of
	// r: nil shows it; an error keeps it hidden, and the page says so. Without the hook,
	// results are hidden. It plays the part Options.BeforeReplay plays for replays: check
	// that this operator may see this scope's results.
	ShowResult func(r *http.Request, rec *receipts.Receipt) error
	// ReadOnly hides every action and refuses every change (as Temporal's
	// TEMPORAL_DISABLE_WRITE_ACTIONS).
	ReadOnly bool
	// Logger gets one record for every change (who, what, which key by its keyed hash).
	// Default: slog.Default().
	Logger *slog.Logger
	// Secret keys the CSRF tokens and the references to keys in links (keys for each are
	// derived from it). Default: 32 random bytes per Handler, so a restart ends open forms
	// and links; give every node behind one address the same secret (32 random bytes, say)
	// if requests are not sticky.
	Secret []byte
	// Limit is the most rows a list shows (default 200).
	Limit int
	// Journal, if set, is the host half's journal (package intents, adapted by
	// consoleintents.Journal) whose uncertain, expired and conflicting actions the Host
	// half page lists, to redeliver, settle or forget.
	Journal Journal
}

// Handler returns the console of db. It dispatches on the last element of the request
// path, so it works mounted under any prefix that ends with a slash, with or without
// http.StripPrefix:
//
//	.../          Overview
//	.../needs     Needs a person: the abandoned claims, oldest first, filtered by scope,
//	              face and age (?scope=S&face=http|mcp|library&older=1h), each with its
//	              uncertain step if its action has steps
//	.../bulk      Forget every claim a filter selects, as not performed (POST)
//	.../key       One key (?scope=S&id=I, as typed, or a link's reference)
//	.../settle    Settle an abandoned claim (GET the form, POST the change)
//	.../step      Settle the uncertain step of an abandoned claim (GET, POST)
//	.../erase     The erasure ledger, and erasing a scope (GET, POST)
//	.../actions   Host half: the journal's actions that need a person (Options.Journal)
//	.../action    One action: redeliver, settle or forget it (GET, POST)
//	.../style.css The stylesheet
func Handler(db *receipts.DB, opts *Options) http.Handler {
	c := &console{db: db}
	if opts != nil {
		c.opts = *opts
	}
	if c.opts.Logger == nil {
		c.opts.Logger = slog.Default()
	}
	if c.opts.Limit <= 0 {
		c.opts.Limit = 200
	}
	secret := c.opts.Secret
	if len(secret) == 0 {
		secret = make([]byte, 32)
		_, _ = rand.Read(secret)
	}
	c.csrfKey = derive(secret, "receiptconsole csrf")
	block, err := aes.NewCipher(derive(secret, "receiptconsole ref"))
	if err != nil {
		panic(err) // a 32-byte key always makes a cipher
	}
	c.refAEAD, err = cipher.NewGCM(block)
	if err != nil {
		panic(err)
	}
	cop := http.NewCrossOriginProtection()
	cop.SetDenyHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c.fail(w, r, http.StatusForbidden, "Refused: a cross-site request. Changes are accepted from the console's own pages only.")
	}))
	c.routed = cop.Handler(http.HandlerFunc(c.route))
	return c
}

type console struct {
	db      *receipts.DB
	opts    Options
	csrfKey []byte
	refAEAD cipher.AEAD
	routed  http.Handler // route behind net/http.CrossOriginProtection
}

// derive is a 32-byte key for one use of secret.
func derive(secret []byte, use string) []byte {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(use))
	return m.Sum(nil)
}

// csp is the Content-Security-Policy of every answer: frame-ancestors and form-action do
// not fall back to default-src, so they are set.
const csp = "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"

func (c *console) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Security-Policy", csp)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Cache-Control", "no-store")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("X-Frame-Options", "DENY")
	if status, err := receiptadmin.Allowed(r, c.opts.Authorize); err != nil {
		msg := "Refused: " + err.Error()
		if errors.Is(err, receiptadmin.ErrNotLoopback) {
			msg = fmt.Sprintf("Refused a request from %s: without an Authorize hook the console answers loopback only (it shows every scope's keys and can settle outcomes). Serve it to others with receiptconsole.Options.Authorize.", r.RemoteAddr)
		}
		if status == http.StatusUnauthorized {
			h.Set("WWW-Authenticate", `Bearer realm="receiptconsole"`)
		}
		http.Error(w, msg, status)
		return
	}
	c.routed.ServeHTTP(w, r)
}

// maxForm bounds a form's body: a result (at most 1 MiB, receipts' limit) with its fields.
const maxForm = 2 << 20

// route dispatches on the last element of the path.
func (c *console) route(w http.ResponseWriter, r *http.Request) {
	page := path.Base(r.URL.Path)
	if strings.HasSuffix(r.URL.Path, "/") || r.URL.Path == "" {
		page = ""
	}
	post := r.Method == http.MethodPost
	if !post && r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD, POST")
		c.fail(w, r, http.StatusMethodNotAllowed, "Method not allowed: the console reads with GET and changes with POST.")
		return
	}
	if post {
		if page != "settle" && page != "step" && page != "erase" && page != "action" && page != "bulk" {
			w.Header().Set("Allow", "GET, HEAD")
			c.fail(w, r, http.StatusMethodNotAllowed, "Method not allowed: this page changes nothing.")
			return
		}
		if c.opts.ReadOnly {
			c.fail(w, r, http.StatusForbidden, "Refused: the console is read-only (Options.ReadOnly): nothing changed.")
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, maxForm)
		if err := r.ParseForm(); err != nil {
			c.fail(w, r, http.StatusBadRequest, "Bad form: "+err.Error())
			return
		}
		if !c.csrfOK(r) {
			c.fail(w, r, http.StatusForbidden, "Refused: the form's token does not match this browser's (a stale page, or a request that did not come from the console). Reload the page and try again: nothing changed.")
			return
		}
	}
	switch page {
	case "":
		c.overview(w, r)
	case "needs":
		c.needs(w, r)
	case "key":
		c.key(w, r)
	case "settle":
		if post {
			c.settlePost(w, r)
		} else {
			c.settleForm(w, r)
		}
	case "step":
		if post {
			c.stepPost(w, r)
		} else {
			c.stepPage(w, r)
		}
	case "erase":
		if post {
			c.erasePost(w, r)
		} else {
			c.erasePage(w, r)
		}
	case "bulk":
		if !post {
			c.fail(w, r, http.StatusMethodNotAllowed, "Method not allowed: a bulk action is a POST from Needs a person.")
			return
		}
		c.bulkPost(w, r)
	case "actions":
		c.actions(w, r)
	case "action":
		if post {
			c.actionPost(w, r)
		} else {
			c.actionPage(w, r)
		}
	case "style.css":
		w.Header().Set("Content-Type", "text/css; charset=utf-8")
		_, _ = w.Write(styleCSS)
	default:
		c.fail(w, r, http.StatusNotFound, fmt.Sprintf("No console page %q.", page))
	}
}

// operator names who made r.
func (c *console) operator(r *http.Request) string {
	if c.opts.Operator != nil {
		if op := c.opts.Operator(r); op != "" {
			return op
		}
	}
	return r.RemoteAddr
}

// The CSRF token: a random cookie (HttpOnly, SameSite=Strict), and in every form a keyed
// hash of it, which a page of another site can neither read nor compute.

const csrfCookie = "receiptconsole_csrf"

// csrfToken returns the token for r's forms, setting the cookie if r has none.
func (c *console) csrfToken(w http.ResponseWriter, r *http.Request) string {
	v := ""
	if ck, err := r.Cookie(csrfCookie); err == nil && len(ck.Value) >= 22 {
		v = ck.Value
	} else {
		b := make([]byte, 18)
		_, _ = rand.Read(b)
		v = base64.RawURLEncoding.EncodeToString(b)
		http.SetCookie(w, &http.Cookie{Name: csrfCookie, Value: v, HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil, Path: cookiePath(r)})
	}
	return c.csrfFor(v)
}

// cookiePath is the console's directory in r's path.
func cookiePath(r *http.Request) string {
	p := r.URL.Path
	if i := strings.LastIndexByte(p, '/'); i >= 0 {
		return p[:i+1]
	}
	return "/"
}

func (c *console) csrfFor(cookie string) string {
	m := hmac.New(sha256.New, c.csrfKey)
	m.Write([]byte(cookie))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

func (c *console) csrfOK(r *http.Request) bool {
	ck, err := r.Cookie(csrfCookie)
	if err != nil || ck.Value == "" {
		return false
	}
	got := r.PostForm.Get("csrf")
	return subtle.ConstantTimeCompare([]byte(got), []byte(c.csrfFor(ck.Value))) == 1
}

// References to keys in links: the key sealed (AES-GCM) under the console's secret, so a
// URL that a proxy logs shows no key.

func (c *console) ref(k receipts.Key) string {
	plain := binary.AppendUvarint(nil, uint64(len(k.Scope)))
	plain = append(plain, k.Scope...)
	plain = append(plain, k.ID...)
	return c.seal(plain, "key")
}

// seal seals plain for a link, bound to what it names (use).
func (c *console) seal(plain []byte, use string) string {
	nonce := make([]byte, c.refAEAD.NonceSize())
	_, _ = rand.Read(nonce)
	return base64.RawURLEncoding.EncodeToString(c.refAEAD.Seal(nonce, nonce, plain, []byte(use)))
}

// open opens what seal sealed for use.
func (c *console) open(s, use string) ([]byte, bool) {
	b, err := base64.RawURLEncoding.DecodeString(s)
	n := c.refAEAD.NonceSize()
	if err != nil || len(b) < n {
		return nil, false
	}
	plain, err := c.refAEAD.Open(nil, b[:n], b[n:], []byte(use))
	return plain, err == nil
}

var errBadRef = errors.New("receiptconsole: the link's key reference is not valid here (made by another console, or before a restart): look the key up by scope and ID")

func (c *console) unref(s string) (receipts.Key, error) {
	plain, ok := c.open(s, "key")
	if !ok {
		return receipts.Key{}, errBadRef
	}
	l, m := binary.Uvarint(plain)
	if m <= 0 || uint64(len(plain)-m) < l {
		return receipts.Key{}, errBadRef
	}
	return receipts.Key{Scope: string(plain[m : m+int(l)]), ID: string(plain[m+int(l):])}, nil
}

// logChange records a change with who made it; keys by their keyed hash (DB.LogKey).
func (c *console) logChange(ctx context.Context, r *http.Request, msg string, attrs ...any) {
	attrs = append([]any{"operator", c.operator(r), "remote", r.RemoteAddr}, attrs...)
	c.opts.Logger.InfoContext(ctx, msg, attrs...)
}
