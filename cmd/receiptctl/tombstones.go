package main

import (
	"errors"
	"fmt"
	"time"

	"github.com/receiptstore/receipts"
	"github.com/spf13/cobra"
)

// Tombstones (receipts.Options.TombstoneWindow): keys whose receipt is past
// retention but which a claim still refuses (ErrExpired). ls --tombstones
// lists them, get explains one.

// tombstoneJSON is one tombstone in ls --tombstones --json.
type tombstoneJSON struct {
	Scope     string    `json:"scope"`
	ID        string    `json:"id"`
	UsedAt    time.Time `json:"used_at"`
	ExpiredAt time.Time `json:"expired_at"`
	Until     time.Time `json:"until"`
	Left      string    `json:"left"`
}

// lsTombstones lists the tombstones in force of f's scope (--dir or --pg:
// the admin endpoint does not serve them).
func (a *app) lsTombstones(cmd *cobra.Command, src source, f receipts.Filter) error {
	o, ok := src.(*offline)
	if !ok {
		return usagef("ls --tombstones works on a store (--dir or --pg) only")
	}
	now := time.Now()
	var out []tombstoneJSON
	tw := newTable(a.stdout)
	for t, err := range o.db.Tombstones(cmd.Context(), f.Scope, f.Limit) {
		if err != nil {
			return err
		}
		j := tombstoneJSON{Scope: t.Key.Scope, ID: t.Key.ID, UsedAt: t.UsedAt, ExpiredAt: t.ExpiredAt, Until: t.Until, Left: t.Left(now).Round(time.Second).String()}
		if a.json {
			out = append(out, j)
			continue
		}
		if len(out) == 0 {
			fmt.Fprintln(tw, "SCOPE\tID\tRECEIPT EXPIRED\tMARKED USED UNTIL\tLEFT")
		}
		out = append(out, j)
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", showKeyPart(j.Scope), showKeyPart(j.ID), showTime(j.ExpiredAt), showTime(j.Until), j.Left)
	}
	if a.json {
		if out == nil {
			out = []tombstoneJSON{}
		}
		return writeJSON(a.stdout, map[string]any{"tombstones": out, "now": now})
	}
	_ = tw.Flush()
	if len(out) == 0 {
		fmt.Fprintln(a.stdout, "no tombstones")
	}
	return nil
}

// tombstoneError explains a get of a key that has a tombstone, not a
// record (exit code 1, as for no record).
func tombstoneError(k receipts.Key, err error) error {
	if er := (*receipts.ErasedError)(nil); errors.As(err, &er) { // erase.go
		return fmt.Errorf("no record of %s: its scope was erased at %s (receipts: scope erased): a claim of it gets ErrErased until %s",
			k, showTime(er.At), showTime(er.Until))
	}
	var ee *receipts.ExpiredError
	if !errors.As(err, &ee) {
		return nil
	}
	return fmt.Errorf("no record of %s: a tombstone (the key was used; its receipt expired at %s): a claim of it gets ErrExpired until %s (%s left)",
		k, showTime(ee.ExpiredAt), showTime(ee.Until), max(time.Until(ee.Until), 0).Round(time.Second))
}
