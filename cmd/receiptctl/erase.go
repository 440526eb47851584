package main

import (
	"encoding/hex"
	"fmt"
	"time"

	"github.com/receiptstore/receipts"
	"github.com/spf13/cobra"
)

// eraseJSON is what erase --json prints, and one line of erasures --json.
type eraseJSON struct {
	ScopeID      string    `json:"scope_id"`
	At           time.Time `json:"at"`
	Until        time.Time `json:"until"`
	Records      int64     `json:"records"`
	KeyDestroyed bool      `json:"key_destroyed"`
}

func newEraseJSON(st receipts.EraseStats) eraseJSON {
	return eraseJSON{ScopeID: hex.EncodeToString(st.ScopeID), At: st.At, Until: st.Until, Records: st.Records, KeyDestroyed: st.KeyDestroyed}
}

func (a *app) eraseCmd() *cobra.Command {
	var yes bool
	cmd := &cobra.Command{
		Use:   "erase SCOPE --yes",
		Short: "Erase every record of a scope, for good (right to erasure)",
		Long: `erase deletes every record of SCOPE: receipts and their results, claims
pending or abandoned, tombstones, and the scope's data key (receipts.DB.EraseScope),
in one atomic step. It cannot be undone: it needs --yes.

Afterwards nothing of the scope can be read, and until the end of its receipts'
window (Retention + TombstoneWindow) every retry of one of its keys is refused
(ErrErased; HTTP 410) instead of running again. The store keeps a record of the
erasure without the scope: its keyed hash, when, and how many records.

If the store's results are encrypted (Options.Keyring), give the key file
(--keyring or $RECEIPTCTL_KEYRING): erase then destroys the scope's key in it, so
that no backup or checkpoint taken before can decrypt the scope's results.
Without it the records are erased, and erase says that the key is not destroyed
yet: run it again with --keyring (it is idempotent).

It works offline (--dir: the service must not hold the directory) or on
PostgreSQL (--pg) next to the service's running nodes.`,
		Example: `  receiptctl --dir ./data erase customer-17 --yes
  RECEIPTCTL_KEYRING=/etc/svc/receipts.keyring receiptctl --pg postgres://ops@db/app erase customer-17 --yes --json`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := a.needDir("erase"); err != nil {
				return err
			}
			scope, err := keyArg("SCOPE", args[0])
			if err != nil {
				return err
			}
			if scope == "" || len(scope) > receipts.MaxKeyPartLen {
				return usagef("erase: a scope of %d bytes (want 1 to %d)", len(scope), receipts.MaxKeyPartLen)
			}
			if !yes {
				return usagef("erase deletes every record of scope %q for good: add --yes to confirm", scope)
			}
			db, closeFn, err := a.openWritable(cmd.Context())
			if err != nil {
				return err
			}
			st, err := db.EraseScope(cmd.Context(), scope)
			closeFn()
			if err != nil {
				return err
			}
			if a.json {
				return writeJSON(a.stdout, newEraseJSON(st))
			}
			fmt.Fprintf(a.stdout, "erased scope %s: %d %s (scope id %x); its keys are refused until %s\n",
				showKeyPart(scope), st.Records, plural(int(st.Records), "record", "records"), st.ScopeID, showTime(st.Until))
			if st.KeyDestroyed {
				fmt.Fprintln(a.stdout, "its key is destroyed in the key file: backups taken before cannot decrypt its results")
			} else {
				fmt.Fprintln(a.stdout, "its key is not destroyed in a key file (no --keyring): backups taken before keep what they hold; run erase again with --keyring if the service encrypts results")
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&yes, "yes", false, "confirm: the scope's records are deleted for good")
	return cmd
}

func (a *app) erasuresCmd() *cobra.Command {
	var scope string
	cmd := &cobra.Command{
		Use:   "erasures",
		Short: "List the scopes erased (their keyed hashes, never the scopes)",
		Long: `erasures lists what the store keeps of every scope erased: its scope id (a
keyed hash of the scope), when, until when its keys are refused, how many
records were deleted, and whether its key was destroyed in the key file. With
--scope S it lists S's erasure only (the scope's id is computed from S).`,
		Example: `  receiptctl --dir ./data erasures
  receiptctl --pg postgres://ops@db/app erasures --scope customer-17 --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := a.needDir("erasures"); err != nil {
				return err
			}
			db, closeFn, err := a.openWritable(cmd.Context())
			if err != nil {
				return err
			}
			defer closeFn()
			var want string
			if scope != "" {
				want = hex.EncodeToString(db.ScopeID(scope))
			}
			out := []eraseJSON{}
			for st, err := range db.Erasures(cmd.Context()) {
				if err != nil {
					return err
				}
				if j := newEraseJSON(st); want == "" || j.ScopeID == want {
					out = append(out, j)
				}
			}
			if a.json {
				return writeJSON(a.stdout, map[string]any{"erasures": out})
			}
			if len(out) == 0 {
				fmt.Fprintln(a.stdout, "no erasures")
				return nil
			}
			tw := newTable(a.stdout)
			fmt.Fprintln(tw, "SCOPE ID\tERASED\tREFUSED UNTIL\tRECORDS\tKEY DESTROYED")
			for _, j := range out {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%v\n", j.ScopeID, showTime(j.At), showTime(j.Until), j.Records, j.KeyDestroyed)
			}
			return tw.Flush()
		},
	}
	cmd.Flags().StringVar(&scope, "scope", "", "list this scope's erasure only")
	return cmd
}
