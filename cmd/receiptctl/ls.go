package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"time"

	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/receiptadmin"
	"github.com/spf13/cobra"
)

func (a *app) lsCmd() *cobra.Command {
	var ff filterFlags
	var tombstones bool
	cmd := &cobra.Command{
		Use:   "ls",
		Short: "List records, filtered by scope, state, or abandoned claims",
		Long: `ls lists the visible records in storage order (by the epoch of their last
write, then scope, then ID), with the same filters as receipts.Filter. --abandoned selects pending claims whose lease ran out:
operations whose outcome is unknown, to reconcile with the provider.
--tombstones lists the keys whose receipt is past retention but that a
claim still refuses (the store's TombstoneWindow), and how long each has left.
Records that cannot be read are reported on stderr (exit code 1).`,
		Example: `  receiptctl --dir ./data ls
  receiptctl --dir ./data ls --scope acct_7 --state succeeded --limit 20
  receiptctl --addr http://127.0.0.1:8081/admin/receipts ls --abandoned --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			f, err := ff.filter()
			if err != nil {
				return err
			}
			src, err := a.openSource()
			if err != nil {
				return err
			}
			defer src.close()
			if tombstones {
				return a.lsTombstones(cmd, src, f)
			}
			if a.json {
				return a.lsJSON(cmd, src, f)
			}
			return a.lsTable(cmd, src, f)
		},
	}
	ff.add(cmd)
	cmd.Flags().BoolVar(&tombstones, "tombstones", false, "list the tombstones in force (keys past retention that a claim still refuses) and how long each has left, instead of records (--dir or --pg)")
	return cmd
}

func (a *app) lsTable(cmd *cobra.Command, src source, f receipts.Filter) error {
	p := a.newProgress("listed")
	tw := newTable(a.stdout)
	n := 0
	_, problems, err := src.list(cmd.Context(), f, func(r receiptadmin.Receipt) error {
		if n == 0 {
			fmt.Fprintln(tw, "SCOPE\tID\tSTATE\tATTEMPTS\tUPDATED\tLEASE\tRESULT")
		}
		n++
		p.add()
		k := r.Key()
		state := r.State
		if r.Abandoned {
			state += " (abandoned)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\t%s\n", showKeyCell(k.Scope), showKeyCell(k.ID), state,
			r.Attempts, showTime(r.UpdatedAt), showLease(&r, time.Now()), resultCell(r.Result, 48))
		return nil
	})
	p.done()
	_ = tw.Flush()
	if err != nil {
		return err
	}
	if n == 0 {
		fmt.Fprintln(a.stdout, "no records match")
	}
	return a.reportProblems(problems)
}

// lsJSON streams a receiptadmin.List, as the admin endpoint does.
func (a *app) lsJSON(cmd *cobra.Command, src source, f receipts.Filter) error {
	bw := bufio.NewWriter(a.stdout)
	defer bw.Flush()
	bw.WriteString("{\n  \"receipts\": [")
	sep := "\n    "
	now, problems, err := src.list(cmd.Context(), f, func(r receiptadmin.Receipt) error {
		b, err := json.Marshal(r)
		if err != nil {
			return err
		}
		bw.WriteString(sep)
		sep = ",\n    "
		_, err = bw.Write(b)
		return err
	})
	if err != nil {
		return err
	}
	if sep != "\n    " {
		bw.WriteString("\n  ")
	}
	if problems == nil {
		problems = []string{}
	}
	t, _ := json.Marshal(now)
	e, _ := json.Marshal(problems)
	fmt.Fprintf(bw, "],\n  \"errors\": %s,\n  \"now\": %s\n}\n", e, t)
	if err := bw.Flush(); err != nil {
		return err
	}
	if len(problems) > 0 {
		return errProblems
	}
	return nil
}
