package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/receiptstore/receipts/intents"
	"github.com/receiptstore/receipts/intents/intentspg"
	"github.com/spf13/cobra"
)

func (a *app) actionsCmd() *cobra.Command {
	var state string
	cmd := &cobra.Command{
		Use:   "actions [JOURNAL-DIR]",
		Short: "List a host's approved actions (package intents) by state",
		Long: `actions lists the actions of a host's journal (package intents): each
approval with its operation key, its request, and where its delivery stands:
approved (being delivered), succeeded, failed, conflict, expired, or uncertain
(its deadline passed without an answer: settle it, or deliver it again under
its key). The journal is a directory (JOURNAL-DIR; a running host holds it
locked), or a schema on PostgreSQL (--pg DSN, and --schema, default intents
here).

Actions are grouped by state, uncertain first, in approval order. An
approved action shows the host that holds its delivery lease (its
DispatcherOptions.HostName, hostname:pid by default) and until when: one
host delivers it at a time, and another takes it over when the lease ends
(a host that died). --json prints them as JSON, with their arguments,
answers, holder and lease_until.`,
		Example: `  receiptctl actions ./host/journal
  receiptctl actions ./host/journal --state uncertain
  receiptctl --pg postgres://app@db/app actions --json`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var st intents.State
			if state != "" {
				s, err := intents.ParseState(state)
				if err != nil {
					return usageError{err}
				}
				st = s
			}
			switch {
			case a.addr != "":
				return usagef("actions reads a host's journal: a directory or --pg, not --addr")
			case a.dir != "":
				return usagef("actions takes the journal's directory as its argument (--dir is a receipts store)")
			case len(args) == 1 && a.pg != "":
				return usagef("give the journal's directory or --pg, not both")
			case len(args) == 0 && a.pg == "":
				return usagef("actions needs the journal's directory, or --pg DSN")
			}
			schema := intentspg.DefaultSchema
			if f := cmd.Flags().Lookup("schema"); f != nil && f.Changed {
				schema = a.schema
			}
			j, closeFn, err := a.openJournal(cmd.Context(), args, schema)
			if err != nil {
				return err
			}
			defer closeFn()
			return a.listActions(cmd.Context(), j, st)
		},
	}
	cmd.Flags().StringVar(&state, "state", "", "only this state: approved, succeeded, failed, conflict, expired or uncertain")
	return cmd
}

// openJournal opens the journal in args[0], or in schema on --pg, never
// creating one where there is none.
func (a *app) openJournal(ctx context.Context, args []string, schema string) (*intents.Journal, func(), error) {
	if len(args) == 1 {
		dir := args[0]
		ents, err := os.ReadDir(dir)
		if err != nil {
			return nil, nil, fmt.Errorf("no journal at %s: %w", dir, err)
		}
		if len(ents) == 0 {
			return nil, nil, fmt.Errorf("no journal at %s: the directory is empty", dir)
		}
		j, err := intents.Open(dir, nil)
		if errors.Is(err, intents.ErrLocked) {
			return nil, nil, fmt.Errorf("%w (a running host holds it; stop it, or list a copy)", err)
		}
		if err != nil {
			return nil, nil, err
		}
		return j, func() { _ = j.Close() }, nil
	}
	pool, err := openPGPool(ctx, a.pg)
	if err != nil {
		return nil, nil, err
	}
	var exists bool
	err = pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = $1 AND c.relname = 'actions')`, schema).Scan(&exists)
	if err == nil && !exists {
		err = fmt.Errorf("no journal in schema %s of %s (give --schema)", schema, describeDSN(a.pg))
	}
	var j *intents.Journal
	if err == nil {
		j, err = intentspg.Open(ctx, pool, &intentspg.Options{Schema: schema})
	}
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	return j, func() { _ = j.Close(); pool.Close() }, nil
}

// actionOrder is the order of the groups: what needs a person first.
var actionOrder = []intents.State{intents.Uncertain, intents.Approved, intents.Conflict, intents.Expired, intents.Failed, intents.Succeeded}

func (a *app) listActions(ctx context.Context, j *intents.Journal, only intents.State) error {
	groups := map[intents.State][]*intents.Action{}
	n := 0
	for act, err := range j.List(ctx, only) {
		if err != nil {
			return err
		}
		groups[act.State] = append(groups[act.State], act)
		n++
	}
	if a.json {
		out := []*intents.Action{}
		for _, st := range actionOrder {
			out = append(out, groups[st]...)
		}
		return writeJSON(a.stdout, out)
	}
	if n == 0 {
		fmt.Fprintln(a.stdout, "no actions")
		return nil
	}
	var counts []string
	for _, st := range actionOrder {
		if c := len(groups[st]); c > 0 {
			counts = append(counts, fmt.Sprintf("%d %s", c, st))
		}
	}
	fmt.Fprintf(a.stdout, "%d %s: %s\n", n, plural(n, "action", "actions"), strings.Join(counts, ", "))
	now := time.Now()
	for _, st := range actionOrder {
		acts := groups[st]
		if len(acts) == 0 {
			continue
		}
		fmt.Fprintf(a.stdout, "\n%s\n", strings.ToUpper(st.String()))
		tw := newTable(a.stdout)
		// Not answered yet: the step of the service's action it reported
		// uncertain (Action.UncertainStep), if it named one.
		unanswered := st == intents.Approved || st == intents.Uncertain
		switch st {
		case intents.Approved: // being delivered: by which host, until when
			fmt.Fprintln(tw, "KEY\tTARGET\tOPERATION\tAPPROVED BY\tAPPROVED\tDEADLINE\tATTEMPTS\tHELD BY\tUNCERTAIN STEP\tLAST ERROR")
		case intents.Uncertain:
			fmt.Fprintln(tw, "KEY\tTARGET\tOPERATION\tAPPROVED BY\tAPPROVED\tDEADLINE\tATTEMPTS\tUNCERTAIN STEP\tANSWER")
		default:
			fmt.Fprintln(tw, "KEY\tTARGET\tOPERATION\tAPPROVED BY\tAPPROVED\tDEADLINE\tATTEMPTS\tANSWER")
		}
		for _, x := range acts {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%d\t", x.Key, showKeyPart(x.Target), showKeyPart(x.Operation),
				showKeyPart(x.ApprovedBy), showTime(x.ApprovedAt), showDeadline(x, now), x.Attempts)
			if st == intents.Approved {
				fmt.Fprintf(tw, "%s\t", showHolder(x, now))
			}
			if unanswered {
				step := "-"
				if x.UncertainStep != "" {
					step = showKeyPart(x.UncertainStep)
				}
				fmt.Fprintf(tw, "%s\t", step)
			}
			fmt.Fprintf(tw, "%s\n", showAnswer(x))
		}
		_ = tw.Flush()
	}
	return nil
}

// showDeadline renders an action's deadline, with the time left while it
// is being delivered.
func showDeadline(x *intents.Action, now time.Time) string {
	s := showTime(x.Deadline)
	if x.State == intents.Approved {
		if left := x.Deadline.Sub(now); left > 0 {
			s += " (in " + left.Round(time.Second).String() + ")"
		} else {
			s += " (passed)"
		}
	}
	return s
}

// showHolder renders an approved action's delivery lease: the host that
// holds it and until when, or "-" when none does (nobody picked it up,
// or its holder closed).
func showHolder(x *intents.Action, now time.Time) string {
	if x.Holder == "" {
		return "-"
	}
	s := showKeyPart(x.Holder) + " until " + showTime(x.LeaseUntil)
	if left := x.LeaseUntil.Sub(now); left > 0 {
		return s + " (in " + left.Round(time.Second).String() + ")"
	}
	return s + " (ended: another host may take it)"
}

// showAnswer renders the answer, or why there is none.
func showAnswer(x *intents.Action) string {
	ans := x.Answer
	if ans == nil {
		if e := x.LastError; e != "" {
			if r := []rune(e); len(r) > 60 { // the end says most: the last attempt's error
				e = "…" + string(r[len(r)-59:])
			}
			return showKeyPart(e)
		}
		return "-"
	}
	var parts []string
	if ans.Status != 0 {
		parts = append(parts, fmt.Sprint(ans.Status))
	}
	if ans.Code != "" {
		parts = append(parts, ans.Code)
	}
	if ans.SettledBy != "" {
		parts = append(parts, "settled by "+ans.SettledBy)
	}
	if b := bytes.TrimSpace(ans.Body); len(b) > 0 {
		parts = append(parts, showBytes(b, 48))
	}
	return strings.Join(parts, " ")
}
