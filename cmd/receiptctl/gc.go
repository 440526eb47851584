package main

import (
	"fmt"

	"github.com/receiptstore/receipts/receiptadmin"
	"github.com/spf13/cobra"
)

func (a *app) gcCmd() *cobra.Command {
	var compact bool
	cmd := &cobra.Command{
		Use:   "gc",
		Short: "Drop the epochs whose records are all past retention",
		Long: `gc runs the store's garbage collection on a directory: every epoch whose
records are all past retention is dropped with one range deletion. A running
service does this itself (Options.GCInterval), so gc works offline only.

gc uses the retention the store records (the one its service last opened it
with), never another one silently: --retention, if given, must match it.
--override-retention drops records older than the given retention instead,
for good, and records that retention as the store's (the service's next
open with its own Options.Retention sets it back; a service that leaves
Options.Retention zero keeps it). A store written by an older version
records no retention: give the service's with --retention.`,
		Example: `  receiptctl --dir ./data gc
  receiptctl --dir ./data gc --retention 168h --compact --json
  receiptctl --dir ./data gc --override-retention 1h   # drops what is older than 1h`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := a.needDir("gc"); err != nil {
				return err
			}
			db, _, err := openResolved(a.dir, a.settings, false, compact, true, a.stderr)
			if err != nil {
				return err
			}
			st, gcErr := db.GC(cmd.Context())
			if err := db.Close(); gcErr == nil {
				gcErr = err
			}
			if gcErr != nil {
				return gcErr
			}
			if a.json {
				return writeJSON(a.stdout, receiptadmin.NewGCStats(st))
			}
			fmt.Fprintf(a.stdout, "dropped %d %s (~%s), %d %s, took %s\n", st.EpochsDropped, plural(st.EpochsDropped, "epoch", "epochs"),
				showSize(st.BytesFreed), st.Writes, plural(st.Writes, "write", "writes"), st.Duration)
			if st.Compacted {
				fmt.Fprintln(a.stdout, "compacted the dropped range")
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&compact, "compact", false, "compact the dropped range at once (returns the disk space now)")
	return cmd
}
