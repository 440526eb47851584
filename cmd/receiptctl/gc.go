package main

import (
	"fmt"

	"github.com/receiptstore/receipts"
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
records no retention: give the service's with --retention.

On PostgreSQL (--pg), gc runs one pass of the service's own partition
maintenance: it drops every partition whose records are all past retention
(DETACH CONCURRENTLY and DROP), under the maintenance lease, so it is safe
while the service runs. One node at a time holds that lease (for a minute
after its pass): if another node or an earlier gc holds it, gc says so and
exits with code 1, having done nothing.`,
		Example: `  receiptctl --dir ./data gc
  receiptctl --pg postgres://app@db/app gc --json
  receiptctl --dir ./data gc --retention 168h --compact --json
  receiptctl --dir ./data gc --override-retention 1h   # drops what is older than 1h`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := a.needDir("gc"); err != nil {
				return err
			}
			var st receipts.GCStats
			if a.pg != "" {
				if compact {
					return usagef("--compact is for a store directory (Pebble) only")
				}
				var err error
				t := a.startTicker("collecting garbage")
				st, err = a.gcPG(cmd.Context())
				t.end()
				if err != nil {
					return err
				}
			} else {
				db, _, err := openResolved(a.dir, a.settings, false, compact, true, a.stderr)
				if err != nil {
					return err
				}
				t := a.startTicker("collecting garbage")
				st, err = db.GC(cmd.Context())
				t.end()
				if cerr := db.Close(); err == nil {
					err = cerr
				}
				if err != nil {
					return err
				}
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
