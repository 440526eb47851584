package main

import (
	"fmt"

	"github.com/receiptstore/receipts/receiptadmin"
	"github.com/spf13/cobra"
)

func (a *app) statsCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "stats",
		Short: "Show record counts by state, epochs, disk use and the last GC",
		Long: `stats counts the visible records by state (abandoned claims are part of
pending), the expired ones GC has not dropped yet, and corrupt ones (exit
code 1 if any), and shows the store's configuration, disk use, the last GC
and, live, the service's counters since it opened the store.

Offline (--dir, --pg) the service's counters, last GC, waiters and replay
cache are unknown: they live in its process, and stats says so instead of
showing zeros (with --json: they are left out and named in
"unknown_offline").

Offline, the retention and lease TTL shown are the ones the store records
(its service's), unless --override-retention is given.`,
		Example: `  receiptctl --dir ./data stats
  receiptctl --addr http://127.0.0.1:8081/admin/receipts stats --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			src, err := a.openSource()
			if err != nil {
				return err
			}
			defer src.close()
			s, err := src.stats(cmd.Context())
			if err != nil {
				return err
			}
			switch {
			case a.json && a.addr == "":
				if err := writeOfflineStatsJSON(a.stdout, &s); err != nil {
					return err
				}
			case a.json:
				if err := writeJSON(a.stdout, s); err != nil {
					return err
				}
			default:
				a.printStats(&s)
			}
			if s.Corrupt > 0 {
				fmt.Fprintf(a.stderr, "receiptctl: %d corrupt %s: run receiptctl verify on the directory\n",
					s.Corrupt, plural(int(s.Corrupt), "record", "records"))
				return errProblems
			}
			return nil
		},
	}
}

func (a *app) printStats(s *receiptadmin.Stats) {
	tw := newTable(a.stdout)
	retention := s.Retention
	if a.addr == "" {
		retention += " (" + a.src.String() + ")"
	}
	fmt.Fprintf(tw, "retention\t%s\n", retention)
	if s.LeaseTTL != "" {
		fmt.Fprintf(tw, "lease ttl\t%s\n", s.LeaseTTL)
	}
	fmt.Fprintf(tw, "epoch width\t%s\n", s.EpochWidth)
	fmt.Fprintf(tw, "live epochs\t%d\n", s.LiveEpochs)
	fmt.Fprintf(tw, "pending\t%d\t(abandoned %d)\n", s.Pending, s.Abandoned)
	fmt.Fprintf(tw, "succeeded\t%d\n", s.Succeeded)
	fmt.Fprintf(tw, "failed\t%d\n", s.Failed)
	fmt.Fprintf(tw, "expired\t%d\t(waiting for GC)\n", s.Expired)
	fmt.Fprintf(tw, "corrupt\t%d\n", s.Corrupt)
	fmt.Fprintf(tw, "disk\t%s\n", showSize(s.DiskBytes))
	if a.addr == "" {
		printOfflineUnknown(tw)
		_ = tw.Flush()
		return
	}
	fmt.Fprintf(tw, "waiters\t%d\t(claims waiting now for another caller's attempt)\n", s.Waiters)
	if g := s.LastGC; g != nil {
		fmt.Fprintf(tw, "last gc\t%s: dropped %d %s (~%s), %d writes, took %s\n", showTime(g.At),
			g.EpochsDropped, plural(g.EpochsDropped, "epoch", "epochs"), showSize(g.BytesFreed), g.Writes, g.Duration)
	} else {
		fmt.Fprintf(tw, "last gc\tnone since the store was opened\n")
	}
	if c := s.Counters; c != (receiptadmin.Counters{}) {
		fmt.Fprintf(tw, "since open\tclaims %d, replays %d, takeovers %d, commits %d, fails %d,\n", c.Claims, c.Replays, c.Takeovers, c.Commits, c.Fails)
		fmt.Fprintf(tw, "\treleases %d, abandons %d, conflicts %d, mismatches %d\n", c.Releases, c.Abandons, c.Conflicts, c.Mismatches)
	}
	if s.ReplayCacheEntries > 0 || s.Counters.ReplayCacheHits > 0 {
		fmt.Fprintf(tw, "replay cache\t%d entries (%s), %d hits since open\n", s.ReplayCacheEntries, showSize(uint64(s.ReplayCacheBytes)), s.Counters.ReplayCacheHits)
	}
	_ = tw.Flush()
}
