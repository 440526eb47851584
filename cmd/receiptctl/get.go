package main

import (
	"fmt"
	"strconv"
	"strings"
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
reconcile and erase read theirs the same way.

A key whose action took steps (receipts.Lease.Step) shows its step journal:
each step's position, name, state, provider key, time and result (size and
a preview). A step that started on a claim that is now abandoned is
UNCERTAIN: it may or may not have happened. The next attempt runs it again
(Recovered, with the same provider key), unless it is settled first: ask
the provider about its key, then
  receiptctl reconcile SCOPE ID --step NAME --done [--result RESULT]
  receiptctl reconcile SCOPE ID --step NAME --not-done
With --json, the record's "steps" hold the same, the uncertain one marked
"uncertain": true.`,
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
	if len(r.Steps) > 0 {
		printSteps(a, r)
	}
}

// stepPreview is how many runes of a step's result its row shows.
const stepPreview = 40

// printSteps shows r's step journal as a table, and says what to do about an uncertain
// step.
func printSteps(a *app, r *receiptadmin.Receipt) {
	fmt.Fprintf(a.stdout, "%-15s%d\n", "steps", len(r.Steps))
	tw := newTable(a.stdout)
	fmt.Fprintln(tw, "  #\tNAME\tSTATE\tPROVIDER KEY\tAT\tRESULT")
	for _, s := range r.Steps {
		state := s.State
		switch {
		case s.Uncertain:
			state = "UNCERTAIN (started, outcome unknown)"
		case s.State == receipts.Pending.String():
			state = "pending (running)"
		}
		res := "-"
		if s.Result != nil {
			res = fmt.Sprintf("%s %s", showSize(uint64(len(s.Result))), showBytes(s.Result, stepPreview))
		}
		fmt.Fprintf(tw, "  %d\t%s\t%s\t%s\t%s\t%s\n", s.Index, showKeyPart(s.Name), state, s.ProviderKey, showTime(s.At), res)
	}
	_ = tw.Flush()
	if u := r.UncertainStep(); u != nil {
		k := r.Key()
		fmt.Fprintf(a.stdout, `uncertain      step %d %s started and its holder is gone: it may or may not have happened.
               The next attempt runs it again (Recovered, same provider key) unless you settle it:
               ask the provider about %s, then
                 receiptctl reconcile %s %s --step %s --done [--result RESULT]   (it happened)
                 receiptctl reconcile %s %s --step %s --not-done                 (it did not)
`, u.Index, strconv.Quote(u.Name), u.ProviderKey,
			shellArg(showKeyPart(k.Scope)), shellArg(showKeyPart(k.ID)), shellArg(u.Name),
			shellArg(showKeyPart(k.Scope)), shellArg(showKeyPart(k.ID)), shellArg(u.Name))
	}
}

// shellArg quotes s for a POSIX shell when it holds anything but plain characters.
func shellArg(s string) string {
	plain := s != ""
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_.:/@+=,", r)) {
			plain = false
			break
		}
	}
	if plain {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
