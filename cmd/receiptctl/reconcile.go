package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/receiptstore/receipts"
	"github.com/spf13/cobra"
)

// reconcileRow is one abandoned claim as reconcile lists it (--json).
type reconcileRow struct {
	Scope       string    `json:"scope"`
	ID          string    `json:"id"`
	Attempts    uint32    `json:"attempts"`
	Token       uint64    `json:"token"`
	UpdatedAt   time.Time `json:"updated_at"`
	LeaseEnded  time.Time `json:"lease_expired_at"`
	ProviderKey string    `json:"provider_key"`
}

// reconcileResult is what settling one claim did (--json).
type reconcileResult struct {
	Scope    string          `json:"scope"`
	ID       string          `json:"id"`
	Settled  string          `json:"settled"` // succeeded, failed or not_performed
	Attempts uint32          `json:"attempts"`
	Token    uint64          `json:"token"`
	Receipt  *reconcileState `json:"receipt,omitempty"`
}

type reconcileState struct {
	State     string    `json:"state"`
	ExpiresAt time.Time `json:"expires_at"`
}

func (a *app) reconcileCmd() *cobra.Command {
	var (
		scope              string
		commit, fail       string
		commitSet, failSet bool
		notPerformed       bool
		token              uint64
		leaseFor           time.Duration
	)
	cmd := &cobra.Command{
		Use:   "reconcile [SCOPE ID]",
		Short: "List the claims whose outcome is unknown, or settle one by hand",
		Long: `reconcile without arguments lists the abandoned claims (pending, lease run
out: their holder crashed or their effect failed in an unknown way) with the
ProviderKey each attempt forwarded to the external provider. Ask the provider
about that key, then settle the claim with what it says:

  --commit RESULT       the effect happened: record a Succeeded receipt with RESULT
  --fail RESULT         it failed for good: record a Failed receipt with RESULT
  --not-performed       it did not happen: free the key (the next call runs it)

Settling takes over exactly the listed attempt (receipts.DB.TakeOver): give
--token with the token from the list, and if another attempt came in since, or
the claim was settled meanwhile, nothing is written (exit code 1). Without
--token, the attempt that is abandoned now is settled. A claim whose holder is
still alive (its lease live) is refused. It works on a store directory (--dir)
or on PostgreSQL (--pg), next to the service's nodes; not through --addr (the
admin endpoint is read-only). A service can do the same continuously with
receipts.Reconciler.`,
		Example: `  receiptctl --dir ./data reconcile
  receiptctl --pg postgres://app@db/app reconcile --scope acct_7 --json
  receiptctl --dir ./data reconcile acct_7 op-42 --token 1093 --commit '{"charge":"ch_123"}'
  receiptctl --pg postgres://app@db/app reconcile acct_7 op-43 --token 1101 --not-performed`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 0 && len(args) != 2 {
				return usagef("reconcile takes no arguments (list) or SCOPE ID (settle one)")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			commitSet, failSet = cmd.Flags().Changed("commit"), cmd.Flags().Changed("fail")
			if err := a.needDir("reconcile"); err != nil {
				return err
			}
			n := 0
			for _, b := range []bool{commitSet, failSet, notPerformed} {
				if b {
					n++
				}
			}
			if len(args) == 0 {
				if n > 0 || token != 0 {
					return usagef("--commit, --fail, --not-performed and --token settle one claim: give SCOPE ID")
				}
			} else if n != 1 {
				return usagef("settling needs exactly one of --commit RESULT, --fail RESULT and --not-performed")
			}
			db, closeDB, err := a.openWritable(cmd.Context())
			if err != nil {
				return err
			}
			defer closeDB()
			if len(args) == 0 {
				return a.reconcileList(cmd.Context(), db, scope)
			}
			k := receipts.Key{Scope: args[0], ID: args[1]}
			var how settleHow
			switch {
			case commitSet:
				how = settleHow{state: receipts.Succeeded, result: []byte(commit)}
			case failSet:
				how = settleHow{state: receipts.Failed, result: []byte(fail)}
			default:
				how = settleHow{notPerformed: true}
			}
			var opts []receipts.ClaimOption
			if leaseFor > 0 {
				opts = append(opts, receipts.LeaseFor(leaseFor))
			}
			return a.reconcileOne(cmd.Context(), db, k, token, how, opts)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&scope, "scope", "", "list: only claims of this scope")
	fl.StringVar(&commit, "commit", "", "the effect happened: record a Succeeded receipt with this result")
	fl.StringVar(&fail, "fail", "", "the effect failed for good: record a Failed receipt with this result")
	fl.BoolVar(&notPerformed, "not-performed", false, "the effect did not happen: free the key")
	fl.Uint64Var(&token, "token", 0, "settle only the attempt with this fencing token (from the list)")
	fl.DurationVar(&leaseFor, "lease", 0, "the lease to hold while settling (default: the store's LeaseTTL)")
	return cmd
}

type settleHow struct {
	state        receipts.State
	result       []byte
	notPerformed bool
}

// openWritable opens the store for a command that writes: the directory
// (--dir) or the schema (--pg).
func (a *app) openWritable(ctx context.Context) (*receipts.DB, func(), error) {
	if a.pg != "" {
		s, _, err := a.openPG(ctx, false)
		if err != nil {
			return nil, nil, err
		}
		return s.db, func() { _ = s.close() }, nil
	}
	db, _, err := openResolved(a.dir, a.settings, false, false, true, a.stderr)
	if err != nil {
		return nil, nil, err
	}
	return db, func() { _ = db.Close() }, nil
}

func (a *app) reconcileList(ctx context.Context, db *receipts.DB, scope string) error {
	var rows []reconcileRow
	var problems []string
	for r, err := range db.Scan(ctx, receipts.Filter{Scope: scope, Abandoned: true}) {
		if err != nil {
			if ctx.Err() != nil {
				return err
			}
			problems = append(problems, err.Error())
			continue
		}
		rows = append(rows, reconcileRow{Scope: r.Key.Scope, ID: r.Key.ID, Attempts: r.Attempts, Token: r.Token,
			UpdatedAt: r.UpdatedAt.UTC(), LeaseEnded: r.LeaseExpiresAt.UTC(), ProviderKey: db.ProviderKey(r.Key)})
	}
	if a.json {
		if rows == nil {
			rows = []reconcileRow{}
		}
		if err := writeJSON(a.stdout, rows); err != nil {
			return err
		}
	} else if len(rows) == 0 {
		fmt.Fprintln(a.stdout, "no abandoned claims: nothing to reconcile")
	} else {
		tw := newTable(a.stdout)
		fmt.Fprintln(tw, "SCOPE\tID\tATTEMPTS\tTOKEN\tLEASE ENDED\tPROVIDER KEY")
		for _, r := range rows {
			fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\t%s\n", showKeyPart(r.Scope), showKeyPart(r.ID), r.Attempts, r.Token, showTime(r.LeaseEnded), r.ProviderKey)
		}
		_ = tw.Flush()
	}
	return a.reportProblems(problems)
}

func (a *app) reconcileOne(ctx context.Context, db *receipts.DB, k receipts.Key, token uint64, how settleHow, opts []receipts.ClaimOption) error {
	r, err := db.Lookup(ctx, k)
	switch {
	case errors.Is(err, receipts.ErrNotFound):
		return fmt.Errorf("%s: not found: no claim to settle", k)
	case err != nil:
		return err
	case r.State != receipts.Pending:
		return fmt.Errorf("%s is already settled (%s): nothing to do", k, r.State)
	case token != 0 && r.Token != token:
		return fmt.Errorf("%s: the listed attempt (token %d) is gone; attempt %d (token %d) holds it now: nothing written",
			k, token, r.Attempts, r.Token)
	}
	l, err := db.TakeOver(ctx, r, opts...)
	var ip *receipts.InProgressError
	switch {
	case errors.As(err, &ip):
		return fmt.Errorf("%s: its holder's lease is live (attempt %d, token %d): it is not abandoned; try after %s",
			k, r.Attempts, r.Token, ip.RetryAfter.Round(time.Millisecond))
	case errors.Is(err, receipts.ErrLeaseLost):
		return fmt.Errorf("%s: another attempt took the claim, or it was settled, since it was read: nothing written", k)
	case err != nil:
		return err
	}
	res := reconcileResult{Scope: k.Scope, ID: k.ID, Attempts: l.Attempt(), Token: l.Token()}
	if how.notPerformed {
		if err := l.Forget(ctx); err != nil {
			return fmt.Errorf("%s: freeing the key: %w", k, err)
		}
		res.Settled = "not_performed"
	} else {
		var rec *receipts.Receipt
		if how.state == receipts.Failed {
			rec, err = l.Fail(ctx, how.result)
		} else {
			rec, err = l.Commit(ctx, how.result)
		}
		if err != nil {
			_ = l.Abandon(context.WithoutCancel(ctx))
			return fmt.Errorf("%s: recording the outcome: %w (the claim stays abandoned)", k, err)
		}
		res.Settled = rec.State.String()
		res.Receipt = &reconcileState{State: rec.State.String(), ExpiresAt: rec.ExpiresAt.UTC()}
	}
	if a.json {
		return writeJSON(a.stdout, res)
	}
	switch res.Settled {
	case "not_performed":
		fmt.Fprintf(a.stdout, "%s: not performed; the key is free (took over attempt %d as token %d)\n", k, res.Attempts, res.Token)
	default:
		fmt.Fprintf(a.stdout, "%s: recorded %s (attempt %d, token %d), kept until %s\n", k, res.Settled, res.Attempts, res.Token, showTime(res.Receipt.ExpiresAt))
	}
	return nil
}
