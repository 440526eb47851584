package receiptconsole

import (
	"bytes"
	"context"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/receiptstore/receipts"
)

//go:embed templates/*.html
var templateFS embed.FS

//go:embed templates/style.css
var styleCSS []byte

var pages = func() map[string]*template.Template {
	funcs := template.FuncMap{"when": when, "ago": ago, "plural": plural}
	base := template.Must(template.New("layout.html").Funcs(funcs).ParseFS(templateFS, "templates/layout.html", "templates/steps.html"))
	m := map[string]*template.Template{}
	for _, name := range []string{"overview", "needs", "key", "settle", "erase", "fail", "actions", "action", "step"} {
		m[name] = template.Must(template.Must(base.Clone()).ParseFS(templateFS, "templates/"+name+".html"))
	}
	return m
}()

// view is what every page gets.
type view struct {
	Title    string
	Nav      string // the page's name in the navigation
	CSRF     string // the token for the page's forms
	ReadOnly bool
	Now      time.Time
	Flash    string // what the change just made did
	Error    string // what was wrong with the input: nothing changed
	Data     any
}

func (c *console) render(w http.ResponseWriter, r *http.Request, status int, name string, v view) {
	v.ReadOnly = c.opts.ReadOnly
	if !c.opts.ReadOnly {
		v.CSRF = c.csrfToken(w, r)
	}
	if v.Now.IsZero() {
		v.Now = c.now(r.Context())
	}
	var buf bytes.Buffer
	if err := pages[name].Execute(&buf, v); err != nil {
		http.Error(w, "receiptconsole: rendering "+name+": "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	if r.Method != http.MethodHead {
		_, _ = w.Write(buf.Bytes())
	}
}

// fail answers with a page that says what went wrong.
func (c *console) fail(w http.ResponseWriter, r *http.Request, status int, msg string) {
	c.render(w, r, status, "fail", view{Title: http.StatusText(status), Error: msg})
}

// storeError answers an error of the store: 400 for bad input, 503 closed, else 500.
func (c *console) storeError(w http.ResponseWriter, r *http.Request, err error) {
	status := http.StatusInternalServerError
	switch {
	case errors.Is(err, receipts.ErrInvalidKey), errors.Is(err, receipts.ErrInvalidArgument):
		status = http.StatusBadRequest
	case errors.Is(err, receipts.ErrClosed):
		status = http.StatusServiceUnavailable
	}
	c.fail(w, r, status, err.Error())
}

func (c *console) now(ctx context.Context) time.Time {
	if t, err := c.db.Now(ctx); err == nil {
		return t
	}
	return time.Now()
}

// when renders a time for people, in UTC.
func when(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format("2006-01-02 15:04:05 UTC")
}

// plural picks the singular or the plural form for n.
func plural(n any, one, many string) string {
	if fmt.Sprint(n) == "1" {
		return one
	}
	return many
}

// ago renders how long before now t was (or "in ..." for a time to come).
func ago(now, t time.Time) string {
	if t.IsZero() {
		return ""
	}
	d := now.Sub(t)
	if d < 0 {
		return "in " + roundDur(-d)
	}
	return roundDur(d) + " ago"
}

func roundDur(d time.Duration) string {
	switch {
	case d >= time.Hour:
		return d.Round(time.Minute).String()
	case d >= time.Minute:
		return d.Round(time.Second).String()
	}
	return d.Round(time.Millisecond).String()
}

// showPart renders a scope or ID as stored: as is when printable, else quoted in Go syntax
// (a hashed key's "\x00h..." under Options.HashKeys). The lookup form takes either form.
func showPart(s string) string {
	if s != "" && utf8.ValidString(s) && !strings.ContainsFunc(s, func(r rune) bool { return !unicode.IsPrint(r) }) {
		return s
	}
	return strconv.Quote(s)
}

// typedPart reads a scope or ID typed into a form: a Go-quoted string is unquoted (the
// form showPart shows), anything else is taken as is.
func typedPart(s string) string {
	if len(s) >= 2 && s[0] == '"' && s[len(s)-1] == '"' {
		if u, err := strconv.Unquote(s); err == nil {
			return u
		}
	}
	return s
}

// faceName names a face for people.
func faceName(face string) string {
	switch face {
	case FaceHTTP:
		return "HTTP (receipthttp)"
	case FaceMCP:
		return "MCP (receiptmcp)"
	}
	return "library"
}
