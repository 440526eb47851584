package receiptconsole

import (
	"bytes"
	"context"
	"embed"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/intents"
	"github.com/receiptstore/receipts/receipthttp"
)

//go:embed templates/*.html
var templateFS embed.FS

//go:embed templates/style.css
var styleCSS []byte

var pages = func() map[string]*template.Template {
	funcs := template.FuncMap{"when": when, "ago": ago, "plural": plural}
	base := template.Must(template.New("layout.html").Funcs(funcs).ParseFS(templateFS, "templates/layout.html"))
	m := map[string]*template.Template{}
	for _, name := range []string{"overview", "needs", "key", "settle", "erase", "fail", "actions", "action"} {
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

// Overview.

type overviewData struct {
	Engine       string
	Durability   []metricRow // the engine's durability figures
	Metrics      []metricRow // every figure of the engine
	Counts       receipts.Counts
	CountErr     string
	Live         int64 // pending with a live lease
	Oldest       *keyRow
	PendingErr   string
	Stats        receipts.Stats
	Tombstone    time.Duration
	ErasuresIn   int
	ErasuresAll  int
	ErasuresErr  string
	PebbleEngine bool
	Journal      bool // the console has the host half's journal
	Uncertain    int  // its uncertain actions
	JournalErr   string
}

type metricRow struct {
	Name, Help, Value string
	Warn              bool
}

// durabilityWarn says which durability figures read as a problem when 0 (or, for
// commits_unconfirmed, when not 0).
var durabilityWarn = map[string]func(float64) bool{
	"postgres_sync_standby_up":           func(v float64) bool { return v == 0 },
	"postgres_sync_standby_configured":   func(v float64) bool { return v == 0 },
	"postgres_synchronous_commit":        func(v float64) bool { return v < 3 },
	"postgres_primary":                   func(v float64) bool { return v == 0 },
	"postgres_replication_visible":       func(v float64) bool { return v == 0 },
	"postgres_commit_check":              func(v float64) bool { return v == 0 },
	"postgres_require_sync_standby":      func(v float64) bool { return false },
	"postgres_commits_unconfirmed_total": func(v float64) bool { return v != 0 },
}

func (c *console) overview(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	now := c.now(ctx)
	d := overviewData{Engine: c.db.EngineName(), Stats: c.db.Stats(), Tombstone: c.db.Options().TombstoneWindow}
	d.PebbleEngine = d.Engine == "pebble"
	for _, m := range c.db.EngineMetrics() {
		row := metricRow{Name: "receipts_" + m.Name, Help: m.Help, Value: strconv.FormatFloat(m.Value, 'f', -1, 64)}
		if warn, ok := durabilityWarn[m.Name]; ok {
			row.Warn = warn(m.Value)
			d.Durability = append(d.Durability, row)
		}
		d.Metrics = append(d.Metrics, row)
	}
	if cnt, err := c.db.Count(ctx); err != nil {
		d.CountErr = err.Error()
	} else {
		d.Counts = cnt
		d.Live = cnt.Pending - cnt.Abandoned
	}
	for rec, err := range c.db.Scan(ctx, receipts.Filter{State: receipts.Pending}) {
		if err != nil {
			d.PendingErr = err.Error()
			if ctx.Err() != nil {
				break
			}
			continue
		}
		if d.Oldest == nil || rec.CreatedAt.Before(d.Oldest.CreatedAt) {
			row := c.keyRow(rec, now)
			d.Oldest = &row
		}
	}
	for st, err := range c.db.Erasures(ctx) {
		if err != nil {
			d.ErasuresErr = err.Error()
			break
		}
		d.ErasuresAll++
		if now.Before(st.Until) {
			d.ErasuresIn++
		}
	}
	if j := c.opts.Journal; j != nil {
		d.Journal = true
		for _, err := range j.List(ctx, intents.Uncertain) {
			if err != nil {
				d.JournalErr = err.Error()
				break
			}
			d.Uncertain++
		}
	}
	c.render(w, r, http.StatusOK, "overview", view{Title: "Overview", Nav: "overview", Now: now, Data: d})
}

// Needs a person.

type keyRow struct {
	Scope, ID   string // as shown
	Ref         string // the link's reference
	Face        string
	State       string
	Abandoned   bool
	Attempts    uint32
	Token       uint64
	CreatedAt   time.Time
	UpdatedAt   time.Time
	LeaseEnds   time.Time
	ExpiresAt   time.Time
	ProviderKey string
}

func (c *console) keyRow(rec *receipts.Receipt, now time.Time) keyRow {
	return keyRow{
		Scope: showPart(rec.Key.Scope), ID: showPart(rec.Key.ID), Ref: c.ref(rec.Key),
		Face: faceName(FaceOf(rec)), State: rec.State.String(), Abandoned: rec.Abandoned(now),
		Attempts: rec.Attempts, Token: rec.Token, CreatedAt: rec.CreatedAt, UpdatedAt: rec.UpdatedAt,
		LeaseEnds: rec.LeaseExpiresAt, ExpiresAt: rec.ExpiresAt, ProviderKey: c.db.ProviderKey(rec.Key),
	}
}

type needsData struct {
	Rows     []keyRow
	More     bool // more than Limit
	Limit    int
	Problems []string
	Hashed   bool
	Filter   needsFilter
	Filtered bool // a filter is set: the bulk action applies to what it selects
	Matched  int  // claims the filter selects (all of them, not only those shown)
}

// needsFilter selects abandoned claims, for the list and for a bulk action.
type needsFilter struct {
	Scope string // typed by the operator; "" every scope
	Face  string // "", "http", "mcp" or "library"
	Older string // a duration: only claims whose lease ended at least this long ago
}

func (f needsFilter) set() bool { return f.Scope != "" || f.Face != "" || f.Older != "" }

// matching returns the abandoned claims f selects, oldest lease first, and the problems of
// the records that could not be read. A bad filter is an error for the page.
func (c *console) matching(ctx context.Context, f needsFilter, now time.Time) ([]*receipts.Receipt, []string, error) {
	var older time.Duration
	if f.Older != "" {
		d, err := time.ParseDuration(strings.TrimSpace(f.Older))
		if err != nil || d < 0 {
			return nil, nil, fmt.Errorf("%w: lease ended at least %q ago: not a duration (30m, 2h)", ErrBadInput, f.Older)
		}
		older = d
	}
	face := ""
	switch f.Face {
	case "", "library":
	case "http":
		face = FaceHTTP
	case "mcp":
		face = FaceMCP
	default:
		return nil, nil, fmt.Errorf("%w: face %q (want http, mcp or library)", ErrBadInput, f.Face)
	}
	var recs []*receipts.Receipt
	var problems []string
	for rec, err := range c.db.Scan(ctx, receipts.Filter{Abandoned: true, Scope: typedPart(f.Scope)}) {
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, receipts.ErrInvalidKey) || errors.Is(err, receipts.ErrInvalidArgument) {
				return nil, nil, err
			}
			if len(problems) < 20 {
				problems = append(problems, err.Error())
			}
			continue
		}
		if fo := FaceOf(rec); (f.Face != "" && fo != face) || now.Sub(rec.LeaseExpiresAt) < older {
			continue
		}
		recs = append(recs, rec)
	}
	slices.SortFunc(recs, func(a, b *receipts.Receipt) int { return a.LeaseExpiresAt.Compare(b.LeaseExpiresAt) })
	return recs, problems, nil
}

func (c *console) needs(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	now := c.now(ctx)
	q := r.URL.Query()
	d := needsData{Limit: c.opts.Limit, Hashed: c.db.HashesKeys(),
		Filter: needsFilter{Scope: q.Get("scope"), Face: q.Get("face"), Older: q.Get("older")}}
	d.Filtered = d.Filter.set()
	v := view{Title: "Needs a person", Nav: "needs", Now: now, Data: &d}
	if q.Get("done") == "bulk" {
		v.Flash = fmt.Sprintf("Forgotten as not performed: %s claims (the next retry of each runs it again); %s had changed since the preview and were left as they were.",
			digits(q.Get("n")), digits(q.Get("skipped")))
	}
	recs, problems, err := c.matching(ctx, d.Filter, now)
	if err != nil {
		if ctx.Err() != nil || errors.Is(err, receipts.ErrClosed) {
			c.storeError(w, r, err)
			return
		}
		v.Error = sentence(err)
		c.render(w, r, http.StatusBadRequest, "needs", v)
		return
	}
	d.Problems, d.Matched = problems, len(recs)
	if len(recs) > c.opts.Limit {
		recs, d.More = recs[:c.opts.Limit], true
	}
	for _, rec := range recs {
		d.Rows = append(d.Rows, c.keyRow(rec, now))
	}
	c.render(w, r, http.StatusOK, "needs", v)
}

// sentence renders an error for a page: what it says without the sentinel's package
// prefix ("receiptconsole: bad input: "), capitalized, ending with a period.
func sentence(err error) string {
	msg := err.Error()
	for _, p := range []string{ErrBadInput.Error() + ": ", "receiptconsole: "} {
		msg = strings.TrimPrefix(msg, p)
	}
	if msg == "" {
		return ""
	}
	r, n := utf8.DecodeRuneInString(msg)
	msg = string(unicode.ToUpper(r)) + msg[n:]
	if !strings.HasSuffix(msg, ".") {
		msg += "."
	}
	return msg
}

// digits keeps only the digits of s (a count from the redirect's query).
func digits(s string) string {
	s = strings.Map(func(r rune) rune {
		if r >= '0' && r <= '9' {
			return r
		}
		return -1
	}, s)
	if s == "" {
		return "0"
	}
	return s
}

// bulkPost forgets, as not performed, every abandoned claim a filter selects, after the
// operator typed how many the preview showed. Each claim is settled fenced by the token
// read now: one that changed since is left as it is.
func (c *console) bulkPost(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	now := c.now(ctx)
	pf := r.PostForm
	f := needsFilter{Scope: pf.Get("scope"), Face: pf.Get("face"), Older: pf.Get("older")}
	d := needsData{Limit: c.opts.Limit, Hashed: c.db.HashesKeys(), Filter: f, Filtered: f.set()}
	v := view{Title: "Needs a person", Nav: "needs", Now: now, Data: &d}
	fail := func(status int, msg string) {
		v.Error = msg + " Nothing changed."
		c.render(w, r, status, "needs", v)
	}
	if !f.set() {
		fail(http.StatusBadRequest, "A bulk action needs a filter (a scope, a face or an age).")
		return
	}
	recs, _, err := c.matching(ctx, f, now)
	if err != nil {
		fail(http.StatusBadRequest, sentence(err))
		return
	}
	d.Matched = len(recs)
	for i, rec := range recs {
		if i == c.opts.Limit {
			d.More = true
			break
		}
		d.Rows = append(d.Rows, c.keyRow(rec, now))
	}
	if strings.TrimSpace(pf.Get("confirm")) != strconv.Itoa(len(recs)) {
		fail(http.StatusBadRequest, fmt.Sprintf("To confirm, type how many claims the filter selects: %d now.", len(recs)))
		return
	}
	n, skipped := 0, 0
	for _, rec := range recs {
		out, err := Settle(ctx, c.db, rec.Key, rec.Token, Settlement{NotPerformed: true})
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			skipped++
			continue
		}
		n++
		c.logChange(ctx, r, "receiptconsole: settled an abandoned claim", c.db.LogKey(rec.Key), "face", out.Face,
			"settled", out.Settled(), "attempt", out.Attempts, "token", out.Token, "bulk", true)
	}
	http.Redirect(w, r, fmt.Sprintf("needs?done=bulk&n=%d&skipped=%d", n, skipped), http.StatusSeeOther)
}

// One key.

type keyData struct {
	Scope, ID   string // the lookup form's values, as typed
	Looked      bool   // a key was asked for
	Found       bool
	Row         keyRow
	Fingerprint string
	RetryGets   string
	Result      *resultView
	Hidden      string // why the result is hidden
	Tombstone   *receipts.ExpiredError
	Erased      *receipts.ErasedError
	NotFound    string
	TombUntil   time.Time // when the key's tombstone ends (ExpiresAt + TombstoneWindow)
	CanSettle   bool
}

type resultView struct {
	Kind    string // "http", "json", "text", "base64", "empty"
	Status  string
	Headers []string
	Body    string
}

func (c *console) key(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	now := c.now(ctx)
	q := r.URL.Query()
	d := keyData{Scope: q.Get("scope"), ID: q.Get("id")}
	var k receipts.Key
	switch {
	case q.Get("k") != "":
		var err error
		if k, err = c.unref(q.Get("k")); err != nil {
			c.render(w, r, http.StatusBadRequest, "key", view{Title: "One key", Nav: "key", Now: now, Error: err.Error(), Data: d})
			return
		}
		d.Looked = true
	case d.Scope != "" || d.ID != "":
		k = receipts.Key{Scope: typedPart(d.Scope), ID: typedPart(d.ID)}
		d.Looked = true
	}
	v := view{Title: "One key", Nav: "key", Now: now, Data: &d}
	if q.Get("done") == "settled" {
		v.Flash = "Settled. What a retry gets now is below."
	}
	if !d.Looked {
		c.render(w, r, http.StatusOK, "key", v)
		return
	}
	rec, err := c.db.Inspect(ctx, k)
	switch {
	case errors.As(err, &d.Tombstone):
		d.NotFound = "No record: its receipt expired, and the key's tombstone is in force."
		d.RetryGets = fmt.Sprintf("refused as expired (ErrExpired; HTTP 410 Gone) until %s; nothing runs", when(d.Tombstone.Until))
	case errors.As(err, &d.Erased):
		d.NotFound = "No record: the key's scope was erased."
		d.RetryGets = fmt.Sprintf("refused as erased (ErrErased; HTTP 410 Gone) until %s; nothing runs", when(d.Erased.Until))
	case errors.Is(err, receipts.ErrNotFound):
		d.NotFound = "No record of this key."
		d.RetryGets = "the key is free: a call runs the action as new"
	case errors.Is(err, receipts.ErrInvalidKey), errors.Is(err, receipts.ErrInvalidArgument):
		v.Error = err.Error()
		c.render(w, r, http.StatusBadRequest, "key", v)
		return
	case err != nil:
		c.storeError(w, r, err)
		return
	default:
		d.Found = true
		d.Row = c.keyRow(rec, now)
		d.Fingerprint = hex.EncodeToString(rec.Fingerprint)
		if tw := c.db.Options().TombstoneWindow; tw > 0 {
			d.TombUntil = rec.ExpiresAt.Add(tw)
		}
		d.RetryGets = retryGetsNow(rec, now)
		d.CanSettle = d.Row.Abandoned && !c.opts.ReadOnly
		if rec.State != receipts.Pending {
			d.Result, d.Hidden = c.result(r, rec)
		}
	}
	c.render(w, r, http.StatusOK, "key", v)
}

// retryGetsNow says what a retry of rec's key gets now.
func retryGetsNow(rec *receipts.Receipt, now time.Time) string {
	switch {
	case rec.State == receipts.Succeeded:
		return fmt.Sprintf("the stored result, as a success, until %s; nothing runs again", when(rec.ExpiresAt))
	case rec.State == receipts.Failed:
		return fmt.Sprintf("the stored result, as a definitive failure (ErrFailed), until %s; nothing runs again", when(rec.ExpiresAt))
	case rec.Abandoned(now):
		return "the outcome is unknown: the next retry takes the claim over, Recovered (it must check with the provider by the provider key before acting), unless the claim is settled first"
	}
	return fmt.Sprintf("in progress: a retry waits for the holder or is told to retry later (ErrInProgress; HTTP 409); the lease ends %s unless renewed", when(rec.LeaseExpiresAt))
}

// result renders rec's result if ShowResult allows it, else says why it is hidden.
func (c *console) result(r *http.Request, rec *receipts.Receipt) (*resultView, string) {
	if c.opts.ShowResult == nil {
		return nil, "hidden: the console was given no ShowResult hook, so it shows no result"
	}
	if err := c.opts.ShowResult(r, rec); err != nil {
		return nil, "hidden: " + err.Error()
	}
	b := rec.Result
	if status, h, body, err := receipthttp.DecodeResponse(b); err == nil {
		v := &resultView{Kind: "http", Status: fmt.Sprintf("%d %s", status, http.StatusText(status)), Body: bodyText(body)}
		for name, vals := range h {
			for _, val := range vals {
				v.Headers = append(v.Headers, name+": "+val)
			}
		}
		slices.Sort(v.Headers)
		return v, ""
	}
	if len(b) == 0 {
		return &resultView{Kind: "empty"}, ""
	}
	return &resultView{Kind: "text", Body: bodyText(b)}, ""
}

// bodyText is a body for people: JSON indented, text as is, else base64.
func bodyText(b []byte) string {
	var out bytes.Buffer
	if json.Valid(b) && json.Indent(&out, b, "", "  ") == nil {
		return out.String()
	}
	if utf8.Valid(b) {
		return string(b)
	}
	return "base64:" + base64.StdEncoding.EncodeToString(b)
}

// Settle.

type settleData struct {
	Ref       string
	Row       keyRow
	Face      string // FaceHTTP, FaceMCP or ""
	FaceName  string
	Form      settleForm
	Outcomes  []outcomeOption
	Confirm   string // what the operator types to confirm: the ID as shown
	Gone      string // the claim is no longer abandoned: why there is no form
	CanSettle bool
}

type settleForm struct {
	Outcome, Status, Headers, Body, Result, Confirm string
}

type outcomeOption struct {
	Value, Label, RetryGets string
	Selected                bool
}

// outcomes are the ways a claim of face may be settled, in its form.
func outcomes(face, selected string) []outcomeOption {
	var o []outcomeOption
	switch face {
	case FaceHTTP:
		o = append(o, outcomeOption{Value: "http", Label: "It happened (or failed for good): record the HTTP response",
			RetryGets: "every retry until the receipt expires gets the response entered here (2xx or 3xx as a success, 4xx as a definitive failure); nothing runs again"})
	case FaceMCP:
		o = append(o, outcomeOption{Value: "mcp", Label: "It happened: record the tool result",
			RetryGets: "every retry until the receipt expires gets the tool result entered here (isError: true as a definitive failure); nothing runs again"})
	default:
		o = append(o,
			outcomeOption{Value: "succeeded", Label: "It happened: record a Succeeded receipt with the result",
				RetryGets: retryGets(Settlement{State: receipts.Succeeded}, "")},
			outcomeOption{Value: "failed", Label: "It failed for good: record a Failed receipt with the result",
				RetryGets: retryGets(Settlement{State: receipts.Failed}, "")})
	}
	o = append(o, outcomeOption{Value: "not_performed", Label: "It did not happen: forget the claim (NotPerformed)",
		RetryGets: retryGets(Settlement{NotPerformed: true}, "")})
	if selected == "" {
		selected = o[0].Value
	}
	for i := range o {
		o[i].Selected = o[i].Value == selected
	}
	return o
}

// settleView reads the claim of ref and fills the settle page's data; it returns a status
// and message when the page cannot be shown at all.
func (c *console) settleView(ctx context.Context, ref string, now time.Time, f settleForm) (*settleData, int, string) {
	k, err := c.unref(ref)
	if err != nil {
		return nil, http.StatusBadRequest, err.Error()
	}
	rec, err := c.db.Inspect(ctx, k)
	if errors.Is(err, receipts.ErrNotFound) {
		return nil, http.StatusNotFound, "No claim of this key to settle: it was settled as not performed, or has expired."
	}
	if err != nil {
		return nil, http.StatusInternalServerError, err.Error()
	}
	d := &settleData{Ref: ref, Row: c.keyRow(rec, now), Face: FaceOf(rec), Form: f}
	d.FaceName = faceName(d.Face)
	d.Outcomes = outcomes(d.Face, f.Outcome)
	d.Confirm = showPart(rec.Key.ID)
	switch {
	case rec.State != receipts.Pending:
		d.Gone = fmt.Sprintf("This claim is already settled (%s): nothing to do.", rec.State)
	case !rec.Abandoned(now):
		d.Gone = fmt.Sprintf("Its holder's lease is live until %s: it is in progress, not abandoned.", when(rec.LeaseExpiresAt))
	case c.opts.ReadOnly:
		d.Gone = "The console is read-only: it settles nothing."
	default:
		d.CanSettle = true
	}
	if d.Form.Status == "" && d.Face == FaceHTTP {
		d.Form.Status = "200"
	}
	return d, 0, ""
}

func (c *console) settleForm(w http.ResponseWriter, r *http.Request) {
	now := c.now(r.Context())
	d, status, msg := c.settleView(r.Context(), r.URL.Query().Get("k"), now, settleForm{})
	if d == nil {
		c.fail(w, r, status, msg)
		return
	}
	c.render(w, r, http.StatusOK, "settle", view{Title: "Settle", Nav: "needs", Now: now, Data: d})
}

func (c *console) settlePost(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	now := c.now(ctx)
	pf := r.PostForm
	f := settleForm{Outcome: pf.Get("outcome"), Status: pf.Get("status"), Headers: pf.Get("headers"),
		Body: pf.Get("body"), Result: pf.Get("result"), Confirm: pf.Get("confirm")}
	ref := pf.Get("k")
	d, status, msg := c.settleView(ctx, ref, now, f)
	if d == nil {
		c.fail(w, r, status, msg)
		return
	}
	again := func(status int, msg string) {
		c.render(w, r, status, "settle", view{Title: "Settle", Nav: "needs", Now: now, Error: msg + " Nothing changed.", Data: d})
	}
	if !d.CanSettle {
		again(http.StatusConflict, d.Gone)
		return
	}
	var token uint64
	if s := pf.Get("token"); s != "" {
		var err error
		if token, err = strconv.ParseUint(s, 10, 64); err != nil {
			again(http.StatusBadRequest, "The form's attempt token is not a number.")
			return
		}
	}
	how, err := parseHow(d.Face, f)
	if err != nil {
		again(http.StatusBadRequest, sentence(err))
		return
	}
	if strings.TrimSpace(f.Confirm) != d.Confirm {
		d.Form.Confirm = ""
		again(http.StatusBadRequest, fmt.Sprintf("To confirm, type the key's ID exactly as shown (%s).", d.Confirm))
		return
	}
	k, _ := c.unref(ref) // settleView checked it
	out, err := Settle(ctx, c.db, k, token, how)
	if err != nil {
		status := http.StatusConflict
		if errors.Is(err, receipts.ErrClosed) {
			status = http.StatusServiceUnavailable
		}
		again(status, err.Error())
		return
	}
	c.logChange(ctx, r, "receiptconsole: settled an abandoned claim", c.db.LogKey(k), "face", out.Face,
		"settled", out.Settled(), "attempt", out.Attempts, "token", out.Token)
	http.Redirect(w, r, "key?k="+c.ref(k)+"&done=settled", http.StatusSeeOther)
}

// parseHow reads the settle form into a Settlement, checking it against the claim's face.
func parseHow(face string, f settleForm) (Settlement, error) {
	valid := slices.ContainsFunc(outcomes(face, ""), func(o outcomeOption) bool { return o.Value == f.Outcome })
	if !valid {
		return Settlement{}, fmt.Errorf("%w: choose how it ended: %q is not one of this key's outcomes (a %s key)", ErrBadInput, f.Outcome, faceName(face))
	}
	switch f.Outcome {
	case "not_performed":
		return Settlement{NotPerformed: true}, nil
	case "succeeded":
		return Settlement{State: receipts.Succeeded, Result: []byte(f.Result)}, nil
	case "failed":
		return Settlement{State: receipts.Failed, Result: []byte(f.Result)}, nil
	case "mcp":
		res, err := ParseToolResult(f.Result)
		if err != nil {
			return Settlement{}, fmt.Errorf("the tool result: %w", err)
		}
		return Settlement{MCP: res}, nil
	}
	st, err := strconv.Atoi(strings.TrimSpace(f.Status))
	if err != nil {
		return Settlement{}, fmt.Errorf("%w: the HTTP status %q is not a number", ErrBadInput, f.Status)
	}
	var lines []string
	for line := range strings.Lines(f.Headers) {
		if line = strings.TrimSpace(line); line != "" {
			lines = append(lines, line)
		}
	}
	h, err := ParseHeaders(lines)
	if err != nil {
		return Settlement{}, fmt.Errorf("the headers: %w", err)
	}
	resp, err := NewHTTPResponse(st, h, []byte(f.Body))
	switch {
	case errors.Is(err, ErrDeclined):
		return Settlement{}, fmt.Errorf("HTTP %d means the handler declined, which receipthttp does not store: if the action did not happen, choose \"It did not happen\": %w", st, err)
	case errors.Is(err, ErrNoOutcome):
		return Settlement{}, fmt.Errorf("HTTP %d is no outcome (receipthttp stores none for 5xx): settle with what happened at the provider: %w", st, err)
	case err != nil:
		return Settlement{}, fmt.Errorf("the response cannot be stored: %w", err)
	}
	return Settlement{HTTP: resp}, nil
}

// Erasure.

type eraseData struct {
	Ledger  []ledgerRow
	Err     string
	Scope   string // the scope typed for a preview
	Preview *erasePreview
	Confirm string
}

type ledgerRow struct {
	ScopeID      string
	At, Until    time.Time
	Records      int64
	KeyDestroyed bool
	InForce      bool
}

type erasePreview struct {
	Scope   string
	Records int
	Until   time.Time
}

func (c *console) eraseData(ctx context.Context, scope string, now time.Time) *eraseData {
	d := &eraseData{Scope: scope}
	for st, err := range c.db.Erasures(ctx) {
		if err != nil {
			d.Err = err.Error()
			break
		}
		d.Ledger = append(d.Ledger, ledgerRow{ScopeID: hex.EncodeToString(st.ScopeID), At: st.At, Until: st.Until,
			Records: st.Records, KeyDestroyed: st.KeyDestroyed, InForce: now.Before(st.Until)})
	}
	slices.SortFunc(d.Ledger, func(a, b ledgerRow) int { return b.At.Compare(a.At) })
	return d
}

// preview counts the records an erasure of scope would delete.
func (c *console) preview(ctx context.Context, scope string, now time.Time) (*erasePreview, error) {
	if scope == "" || len(scope) > receipts.MaxKeyPartLen {
		return nil, fmt.Errorf("%w: a scope is 1 to %d bytes; this one is %d", ErrBadInput, receipts.MaxKeyPartLen, len(scope))
	}
	p := &erasePreview{Scope: scope}
	for _, err := range c.db.Scan(ctx, receipts.Filter{Scope: scope}) {
		if err != nil {
			return nil, err
		}
		p.Records++
	}
	o := c.db.Options()
	p.Until = now.Add(o.Retention)
	if o.TombstoneWindow > 0 {
		p.Until = p.Until.Add(o.TombstoneWindow)
	}
	return p, nil
}

func (c *console) erasePage(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	now := c.now(ctx)
	scope := typedPart(r.URL.Query().Get("scope"))
	d := c.eraseData(ctx, r.URL.Query().Get("scope"), now)
	v := view{Title: "Erasure", Nav: "erase", Now: now, Data: d}
	if r.URL.Query().Get("done") == "erased" {
		v.Flash = "Erased. The ledger below keeps the scope's keyed hash, never the scope; its keys are refused until the time shown."
	}
	status := http.StatusOK
	if r.URL.Query().Has("scope") {
		p, err := c.preview(ctx, scope, now)
		if err != nil {
			v.Error = sentence(err)
			status = http.StatusBadRequest
		} else {
			d.Preview = p
		}
	}
	c.render(w, r, status, "erase", v)
}

func (c *console) erasePost(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	now := c.now(ctx)
	scope := r.PostForm.Get("scope")
	d := c.eraseData(ctx, showPart(scope), now)
	v := view{Title: "Erasure", Nav: "erase", Now: now, Data: d}
	p, err := c.preview(ctx, scope, now)
	if err != nil {
		v.Error = sentence(err) + " Nothing changed."
		c.render(w, r, http.StatusBadRequest, "erase", v)
		return
	}
	d.Preview = p
	if typedPart(strings.TrimSpace(r.PostForm.Get("confirm"))) != scope {
		v.Error = fmt.Sprintf("To confirm, type the scope exactly (%s). Nothing changed.", showPart(scope))
		c.render(w, r, http.StatusBadRequest, "erase", v)
		return
	}
	st, err := c.db.EraseScope(ctx, scope)
	if err != nil {
		v.Error = err.Error() + " Nothing changed."
		c.render(w, r, http.StatusConflict, "erase", v)
		return
	}
	c.logChange(ctx, r, "receiptconsole: erased a scope", "scope_id", hex.EncodeToString(st.ScopeID),
		"records", st.Records, "until", st.Until, "key_destroyed", st.KeyDestroyed)
	http.Redirect(w, r, "erase?done=erased", http.StatusSeeOther)
}
