package receiptconsole

import (
	"context"
	"encoding/hex"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/receiptstore/receipts"
)

// The Erasure page: the ledger, and EraseScope behind a preview and a typed scope.

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
