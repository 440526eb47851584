package main

import (
	"fmt"

	"github.com/receiptstore/receipts"
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

The store does not record its retention, so gc requires --retention: give the
service's Options.Retention. Records older than it are dropped for good.`,
		Example: `  receiptctl --dir ./data gc --retention 24h
  receiptctl --dir ./data gc --retention 72h --compact --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := a.needDir("gc"); err != nil {
				return err
			}
			if !cmd.Flags().Changed("retention") {
				return usagef("gc drops records older than the retention, which the store does not record: give the service's Options.Retention with --retention (for example --retention 24h)")
			}
			// Open read-only first, so that a directory holding some other
			// Pebble store is reported rather than given a receipts meta record.
			probe, err := a.openStore(true)
			if err != nil {
				return err
			}
			if err := probe.Close(); err != nil {
				return err
			}
			db, err := openStoreOpts(a.dir, a.retention, false, compact, a.stderr)
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
				return writeJSON(a.stdout, receipts.NewAdminGCStats(st))
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
