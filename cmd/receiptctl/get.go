package main

import (
	"fmt"
	"time"

	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/receiptadmin"
	"github.com/spf13/cobra"
)

func (a *app) getCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "get SCOPE ID",
		Short: "Show the record of one operation key, in any state",
		Long: `get shows the record of the operation SCOPE/ID: its state (pending,
succeeded, failed), attempts, fencing token, times and stored result. A
pending record whose lease ran out is an abandoned claim: its outcome is
unknown until the next attempt reconciles it. Exit code 1 if there is none.

SCOPE and ID are taken as given or, in double quotes, as the Go string
literal ls shows for a key part it cannot print (a hashed key, "\x00h...");
reconcile and erase read theirs the same way.`,
		Example: `  receiptctl --dir ./data get acct_7 op-42
  receiptctl --addr http://127.0.0.1:8081/admin/receipts get acct_7 op-42 --json`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			k, err := keyArgs(args[0], args[1])
			if err != nil {
				return err
			}
			if k.Scope == "" || k.ID == "" {
				return usagef("SCOPE and ID must not be empty")
			}
			src, err := a.openSource()
			if err != nil {
				return err
			}
			defer src.close()
			r, err := src.get(cmd.Context(), k)
			switch {
			case tombstoneError(k, err) != nil:
				return tombstoneError(k, err)
			case notFound(err):
				return fmt.Errorf("no record of %s", k)
			case err != nil:
				return err
			}
			if a.json {
				return writeJSON(a.stdout, r)
			}
			printReceipt(a, &r, time.Now())
			return nil
		},
	}
}

// printReceipt shows one record, a field a line.
func printReceipt(a *app, r *receiptadmin.Receipt, now time.Time) {
	const pad = "               " // the width of a label column
	line := func(label, format string, args ...any) {
		fmt.Fprintf(a.stdout, "%-15s%s\n", label, indent(fmt.Sprintf(format, args...), pad))
	}
	k := r.Key()
	line("scope", "%s", showKeyPart(k.Scope))
	line("id", "%s", showKeyPart(k.ID))
	state := r.State
	if r.State == receipts.Pending.String() {
		if r.Abandoned || !now.Before(r.LeaseExpiresAt) {
			state += " (abandoned: the lease ran out, outcome unknown; the next attempt reconciles it)"
		} else {
			state += " (lease live: an attempt is running)"
		}
	}
	line("state", "%s", state)
	line("attempts", "%d", r.Attempts)
	line("token", "%d", r.Token)
	line("fingerprint", "%s", r.Fingerprint)
	line("created", "%s", showTime(r.CreatedAt))
	line("updated", "%s", showTime(r.UpdatedAt))
	line("expires", "%s", showTime(r.ExpiresAt))
	if !r.LeaseExpiresAt.IsZero() {
		line("lease expires", "%s (%s)", showTime(r.LeaseExpiresAt), showLease(r, now))
	}
	// A stored HTTP response as status, headers and body; JSON indented;
	// text as is (it may span lines); else base64 (result.go).
	if r.Result == nil {
		line("result", "%s", showBytes(r.Result, 0))
	} else {
		line("result", "%s", resultLines(r.Result))
	}
}
