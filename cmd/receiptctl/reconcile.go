package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/receiptconsole"
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
	Face        string    `json:"face,omitempty"` // receipthttp or receiptmcp: the front end that claimed the key
	// Step is the claim's uncertain step, if its action took steps: the one that started
	// and whose outcome is unknown (settle it with --step).
	Step *reconcileStep `json:"step,omitempty"`
}

// reconcileStep is an abandoned claim's uncertain step (--json).
type reconcileStep struct {
	Index       int    `json:"index"`
	Name        string `json:"name"`
	ProviderKey string `json:"provider_key"`
}

// stepResult is what settling one step did (--json).
type stepResult struct {
	Scope       string `json:"scope"`
	ID          string `json:"id"`
	Step        string `json:"step"`
	Index       int    `json:"index"`
	ProviderKey string `json:"provider_key"`
	Settled     string `json:"settled"` // done, failed or not_done
	Attempts    uint32 `json:"attempts"`
	Token       uint64 `json:"token"`
}

// reconcileResult is what settling one claim did (--json).
type reconcileResult struct {
	Scope    string          `json:"scope"`
	ID       string          `json:"id"`
	Face     string          `json:"face,omitempty"`
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
		httpStatus         int
		httpBody           string
		httpHeaders        []string
		mcpResult          string
		step               string
		stepDone, stepFail bool
		stepNotDone        bool
		stepResult         string
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

A key claimed by a front end is answered from its receipt in that front end's
form, so it is settled in that form (the list's FACE column says which; the
front ends mark the fingerprints they store):

  --http-status CODE    a receipthttp key: record the HTTP response its retries
                        get, with --http-body BODY and --http-header 'Name: value'
                        (repeatable): 2xx and 3xx as Succeeded, 4xx as Failed, as
                        receipthttp's DefaultPolicy stores them (409, 429 and 5xx
                        are no outcome to store: use --not-performed, or wait)
  --mcp-result JSON     a receiptmcp key: record the tool result its retries get
                        (a CallToolResult: {"content":[...],"structuredContent":
                        ...,"isError":false}); isError results as Failed

A claim whose action took steps (receipts.Lease.Step) resumes: its recorded
steps are never run again. The list's STEP column names its uncertain step,
the one that started when the holder was lost (get shows the journal). Ask
the provider about that step's provider key (get shows it), then settle the
step alone; the claim is abandoned again at once, and the next retry resumes
the action after it:

  --step NAME --done [--result RESULT]    the step happened, with RESULT
  --step NAME --failed [--result RESULT]  it failed for good (the retry gets ErrFailed)
  --step NAME --not-done                  it did not happen: the retry runs it again,
                                          as never started

--not-performed is refused on such a claim once a step is recorded: the
steps happened, and forgetting the claim would run them again.

--commit and --fail are refused on a front end's key (its retries would be
answered with an error for the whole retention), and nothing is written. On a
key no front end marked (claimed by Do, or by a front end older than the
marks), --http-status and --mcp-result store what they are told.

Settling takes over exactly the listed attempt (receipts.DB.TakeOver): give
--token with the token from the list, and if another attempt came in since, or
the claim was settled meanwhile, nothing is written (exit code 1). Without
--token, the attempt that is abandoned now is settled. A claim whose holder is
still alive (its lease live) is refused. It works on a store directory (--dir)
or on PostgreSQL (--pg), next to the service's nodes; not through --addr (the
admin endpoint is read-only). A service can do the same continuously with
reconcile.Reconciler.`,
		Example: `  receiptctl --dir ./data reconcile
  receiptctl --pg postgres://app@db/app reconcile --scope acct_7 --json
  receiptctl --dir ./data reconcile acct_7 op-42 --token 1093 --commit '{"charge":"ch_123"}'
  receiptctl --pg postgres://app@db/app reconcile acct_7 op-43 --token 1101 --not-performed
  receiptctl --pg postgres://app@db/app reconcile alice op-4 --http-status 201 \
      --http-header 'Content-Type: application/json' --http-body '{"id":7}'
  receiptctl --dir ./data reconcile agent-1 op-9 --mcp-result '{"content":[{"type":"text","text":"created 7"}]}'
  receiptctl --dir ./data reconcile agent-1 trip-3 --token 77 --step charge --done --result '{"charge":"ch_9"}'
  receiptctl --pg postgres://app@db/app reconcile agent-1 trip-4 --step charge --not-done`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 0 && len(args) != 2 {
				return usagef("reconcile takes no arguments (list) or SCOPE ID (settle one)")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			commitSet, failSet = cmd.Flags().Changed("commit"), cmd.Flags().Changed("fail")
			httpSet, mcpSet := cmd.Flags().Changed("http-status"), cmd.Flags().Changed("mcp-result")
			if err := a.needDir("reconcile"); err != nil {
				return err
			}
			n := 0
			for _, b := range []bool{commitSet, failSet, notPerformed, httpSet, mcpSet} {
				if b {
					n++
				}
			}
			if cmd.Flags().Changed("step") || stepDone || stepFail || stepNotDone || cmd.Flags().Changed("result") {
				return a.reconcileStepCmd(cmd, args, n, step, stepDone, stepFail, stepNotDone, stepResult, token, leaseFor)
			}
			if !httpSet && (cmd.Flags().Changed("http-body") || len(httpHeaders) > 0) {
				return usagef("--http-body and --http-header go with --http-status")
			}
			if len(args) == 0 {
				if n > 0 || token != 0 {
					return usagef("--commit, --fail, --not-performed, --http-status, --mcp-result and --token settle one claim: give SCOPE ID")
				}
			} else if n != 1 {
				return usagef("settling needs exactly one of --commit RESULT, --fail RESULT, --not-performed, --http-status CODE and --mcp-result JSON")
			}
			var how receiptconsole.Settlement
			switch {
			case commitSet:
				how = receiptconsole.Settlement{State: receipts.Succeeded, Result: []byte(commit)}
			case failSet:
				how = receiptconsole.Settlement{State: receipts.Failed, Result: []byte(fail)}
			case httpSet:
				resp, err := httpSettlement(httpStatus, httpHeaders, httpBody)
				if err != nil {
					return err
				}
				how = receiptconsole.Settlement{HTTP: resp}
			case mcpSet:
				res, err := mcpSettlement(mcpResult)
				if err != nil {
					return err
				}
				how = receiptconsole.Settlement{MCP: res}
			default:
				how = receiptconsole.Settlement{NotPerformed: true}
			}
			db, closeDB, err := a.openWritable(cmd.Context())
			if err != nil {
				return err
			}
			defer closeDB()
			if len(args) == 0 {
				return a.reconcileList(cmd.Context(), db, scope)
			}
			k, err := keyArgs(args[0], args[1])
			if err != nil {
				return err
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
	fl.IntVar(&httpStatus, "http-status", 0, "a receipthttp key: record the HTTP response with this status (2xx, 3xx: succeeded; 4xx: failed)")
	fl.StringVar(&httpBody, "http-body", "", "with --http-status: the response's body")
	fl.StringArrayVar(&httpHeaders, "http-header", nil, "with --http-status: a response header, 'Name: value' (repeatable)")
	fl.StringVar(&mcpResult, "mcp-result", "", "a receiptmcp key: record this tool result (CallToolResult JSON; isError: failed)")
	fl.StringVar(&step, "step", "", "settle this step of the claim (its uncertain one), with --done, --failed or --not-done")
	fl.BoolVar(&stepDone, "done", false, "with --step: the step happened (its result: --result)")
	fl.BoolVar(&stepFail, "failed", false, "with --step: the step failed for good (its result: --result)")
	fl.BoolVar(&stepNotDone, "not-done", false, "with --step: the step did not happen (the next retry runs it again)")
	fl.StringVar(&stepResult, "result", "", "with --step and --done or --failed: the step's result")
	return cmd
}

// The front ends whose keys reconcile recognises (shared with the console:
// receiptconsole.Settle).
const (
	faceHTTP = receiptconsole.FaceHTTP
	faceMCP  = receiptconsole.FaceMCP
)

// faceOf names the front end that claimed r's key, "" if none did (or one
// older than the marks).
func faceOf(r *receipts.Receipt) string { return receiptconsole.FaceOf(r) }

// wrongFormFlags words a *receiptconsole.WrongFormError in reconcile's flags.
func wrongFormFlags(e *receiptconsole.WrongFormError) error {
	how := "--http-status (with --http-body, --http-header)"
	form := "an HTTP response"
	if e.Face == faceMCP {
		how, form = "--mcp-result", "a tool result"
	}
	return fmt.Errorf("%s was claimed by %s: its retries are answered with %s stored in its receipt, and anything else would be answered with an error; settle it with %s or --not-performed: nothing written",
		e.Key, e.Face, form, how)
}

// httpSettlement checks the response --http-status, --http-header and
// --http-body give, before anything is taken over.
func httpSettlement(status int, headers []string, body string) (*receiptconsole.HTTPResponse, error) {
	h, err := receiptconsole.ParseHeaders(headers)
	if err != nil {
		return nil, usagef("--http-header: %v", err)
	}
	resp, err := receiptconsole.NewHTTPResponse(status, h, []byte(body))
	switch {
	case errors.Is(err, receiptconsole.ErrDeclined):
		return nil, usagef("--http-status %d means the handler declined, which receipthttp does not store: use --not-performed", status)
	case errors.Is(err, receiptconsole.ErrNoOutcome):
		return nil, usagef("--http-status %d is no outcome (receipthttp stores none for 5xx): settle with what happened", status)
	case err != nil:
		return nil, usagef("%v", err)
	}
	return resp, nil
}

// mcpSettlement parses and checks the tool result --mcp-result gives.
func mcpSettlement(js string) (*mcp.CallToolResult, error) {
	res, err := receiptconsole.ParseToolResult(js)
	if err != nil {
		return nil, usagef("--mcp-result: %v", err)
	}
	return res, nil
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
			UpdatedAt: r.UpdatedAt.UTC(), LeaseEnded: r.LeaseExpiresAt.UTC(), ProviderKey: db.ProviderKey(r.Key), Face: faceOf(r)})
	}
	for i := range rows { // after the scan: its uncertain step, if its action took steps
		var err error
		if rows[i].Step, err = uncertainStep(ctx, db, receipts.Key{Scope: rows[i].Scope, ID: rows[i].ID}); err != nil {
			if ctx.Err() != nil {
				return err
			}
			if !errors.Is(err, receipts.ErrNotFound) { // settled and gone since
				problems = append(problems, err.Error())
			}
		}
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
		fmt.Fprintln(tw, "SCOPE\tID\tATTEMPTS\tTOKEN\tLEASE ENDED\tPROVIDER KEY\tFACE\tSTEP")
		for _, r := range rows {
			face := r.Face
			if face == "" {
				face = "-"
			}
			st := "-"
			if r.Step != nil {
				st = fmt.Sprintf("%d %s (uncertain)", r.Step.Index, showKeyPart(r.Step.Name))
			}
			fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\t%s\t%s\t%s\n", showKeyPart(r.Scope), showKeyPart(r.ID), r.Attempts, r.Token, showTime(r.LeaseEnded), r.ProviderKey, face, st)
		}
		_ = tw.Flush()
	}
	return a.reportProblems(problems)
}

func (a *app) reconcileOne(ctx context.Context, db *receipts.DB, k receipts.Key, token uint64, how receiptconsole.Settlement, opts []receipts.ClaimOption) error {
	out, err := receiptconsole.Settle(ctx, db, k, token, how, opts...)
	var wf *receiptconsole.WrongFormError
	if errors.As(err, &wf) {
		return wrongFormFlags(wf)
	}
	if err != nil {
		return err
	}
	res := reconcileResult{Scope: k.Scope, ID: k.ID, Face: out.Face, Attempts: out.Attempts, Token: out.Token, Settled: out.Settled()}
	if out.Receipt != nil {
		res.Receipt = &reconcileState{State: out.Receipt.State.String(), ExpiresAt: out.Receipt.ExpiresAt.UTC()}
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

// reconcileStepCmd checks reconcile's step flags and settles one step (--step). n is how
// many of the whole claim's outcomes were given.
func (a *app) reconcileStepCmd(cmd *cobra.Command, args []string, n int, step string, done, failed, notDone bool, result string, token uint64, leaseFor time.Duration) error {
	switch {
	case len(args) != 2:
		return usagef("--step settles a step of one claim: give SCOPE ID")
	case n > 0:
		return usagef("--step settles one step; --commit, --fail, --not-performed, --http-status and --mcp-result settle the whole claim: give one or the other")
	case step == "":
		return usagef("--done, --failed, --not-done and --result go with --step NAME (the claim's uncertain step: receiptctl get shows it)")
	}
	m := 0
	for _, b := range []bool{done, failed, notDone} {
		if b {
			m++
		}
	}
	if m != 1 {
		return usagef("--step needs exactly one of --done, --failed and --not-done")
	}
	if notDone && cmd.Flags().Changed("result") {
		return usagef("--result goes with --done or --failed: a step not done has no result")
	}
	how := receiptconsole.StepSettlement{State: receipts.Pending}
	switch {
	case done:
		how = receiptconsole.StepSettlement{State: receipts.Succeeded, Result: []byte(result)}
	case failed:
		how = receiptconsole.StepSettlement{State: receipts.Failed, Result: []byte(result)}
	}
	if len(how.Result) > receipts.MaxStepResultSize {
		return usagef("--result of %d bytes: a step's result is at most %d bytes", len(how.Result), receipts.MaxStepResultSize)
	}
	k, err := keyArgs(args[0], args[1])
	if err != nil {
		return err
	}
	db, closeDB, err := a.openWritable(cmd.Context())
	if err != nil {
		return err
	}
	defer closeDB()
	var opts []receipts.ClaimOption
	if leaseFor > 0 {
		opts = append(opts, receipts.LeaseFor(leaseFor))
	}
	out, err := receiptconsole.SettleStep(cmd.Context(), db, k, token, step, how, opts...)
	if err != nil {
		return err
	}
	res := stepResult{Scope: k.Scope, ID: k.ID, Step: out.Step, Index: out.Index, ProviderKey: out.ProviderKey,
		Settled: out.Settled, Attempts: out.Attempts, Token: out.Token}
	if a.json {
		return writeJSON(a.stdout, res)
	}
	what := map[string]string{
		"done":     "done (the next retry gets its result without running it)",
		"failed":   "failed for good (the next retry gets ErrFailed for it without running it)",
		"not_done": "not done (the next retry runs it again, as never started)",
	}[res.Settled]
	fmt.Fprintf(a.stdout, "%s: step %d %s settled as %s; the claim is abandoned again, so the next retry resumes the action (took over attempt %d as token %d)\n",
		k, res.Index, strconv.Quote(res.Step), what, res.Attempts, res.Token)
	return nil
}

// uncertainStep is the uncertain step of k's abandoned claim, nil if it has none.
func uncertainStep(ctx context.Context, db *receipts.DB, k receipts.Key) (*reconcileStep, error) {
	steps, err := db.Steps(ctx, k)
	if err != nil {
		return nil, err
	}
	u := receiptconsole.UncertainStep(steps, true)
	if u == nil {
		return nil, nil
	}
	return &reconcileStep{Index: u.Index, Name: u.Name, ProviderKey: u.ProviderKey}, nil
}
