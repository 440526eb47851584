package receiptconsole

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/receiptstore/receipts"
)

// The Needs a person page: the abandoned claims, their filters, and the bulk forget.

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
	// Step is the claim's step whose outcome is unknown (Needs a person only): for an action
	// of several steps, the provider key to ask about is this step's, not the action's.
	Step *stepRow
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
	d := needsData{Limit: c.opts.Limit, Hashed: c.db.Options().HashKeys,
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
		row := c.keyRow(rec, now)
		// One journal read per row shown (at most Limit): no result is read out of it.
		_, row.Step, err = c.stepRows(ctx, rec, now, false)
		switch {
		case err == nil, errors.Is(err, receipts.ErrNotFound): // settled or forgotten since the scan
		case ctx.Err() != nil || errors.Is(err, receipts.ErrClosed):
			c.storeError(w, r, err)
			return
		case len(d.Problems) < 20:
			d.Problems = append(d.Problems, err.Error())
		}
		d.Rows = append(d.Rows, row)
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
	d := needsData{Limit: c.opts.Limit, Hashed: c.db.Options().HashKeys, Filter: f, Filtered: f.set()}
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
