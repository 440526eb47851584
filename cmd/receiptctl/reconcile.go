package main

import (
	"context"
	"errors"
	"fmt"
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
  receiptctl --dir ./data reconcile agent-1 op-9 --mcp-result '{"content":[{"type":"text","text":"created 7"}]}'`,
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
		fmt.Fprintln(tw, "SCOPE\tID\tATTEMPTS\tTOKEN\tLEASE ENDED\tPROVIDER KEY\tFACE")
		for _, r := range rows {
			face := r.Face
			if face == "" {
				face = "-"
			}
			fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\t%s\t%s\n", showKeyPart(r.Scope), showKeyPart(r.ID), r.Attempts, r.Token, showTime(r.LeaseEnded), r.ProviderKey, face)
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
