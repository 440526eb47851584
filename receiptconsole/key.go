package receiptconsole

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"time"
	"unicode/utf8"

	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/receipthttp"
)

// The One key page: a record, what a retry gets now, and its result if allowed.

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
	Steps       []stepRow // the key's step journal (Lease.Step)
	Uncertain   *stepRow  // its step whose outcome is unknown, if any
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
	switch q.Get("done") {
	case "settled":
		v.Flash = "Settled. What a retry gets now is below."
	case "step":
		v.Flash = "Step settled; the claim stays abandoned, so the next retry resumes the action. What it gets now is below."
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
		if d.Steps, d.Uncertain, err = c.stepRows(ctx, rec, now, c.mayShow(r, rec)); err != nil && !errors.Is(err, receipts.ErrNotFound) {
			c.storeError(w, r, err)
			return
		}
		if d.Uncertain != nil {
			d.RetryGets = resumeGets(d.Uncertain)
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
