package receiptconsole

// Settling one step of an abandoned claim by hand (receipts.Lease.SettleStep): what the
// console's key page and `receiptctl reconcile SCOPE ID --step NAME` both do. The claim is
// taken over (fenced by the listed attempt's token), the step whose outcome is unknown is
// settled, and the claim is abandoned again at once: the next retry of the key takes it
// over and resumes the action, replaying the settled step (or running it as never started).

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/receiptstore/receipts"
)

// StepSettlement is how an uncertain step is settled.
type StepSettlement struct {
	// State is Succeeded (the step happened: done), Failed (it failed for good) or Pending
	// (it did not happen: not done, its start is taken back).
	State receipts.State
	// Result is the step's result for Succeeded and Failed (what its fn would have
	// returned); ignored for Pending.
	Result []byte
}

// Settled names the settlement: "done", "failed" or "not_done".
func (h StepSettlement) Settled() string {
	switch h.State {
	case receipts.Succeeded:
		return "done"
	case receipts.Failed:
		return "failed"
	}
	return "not_done"
}

// StepOutcome is what settling one step did.
type StepOutcome struct {
	Key         receipts.Key
	Step        string // the step's name
	Index       int    // its position in the action
	ProviderKey string // the step's provider key
	Settled     string // StepSettlement.Settled
	Attempts    uint32 // the attempt that settled it (the operator's takeover)
	Token       uint64
}

// UncertainStep returns the step of steps whose outcome is unknown given the claim's
// state: the journal's pending step when the claim is abandoned. It returns nil if there
// is none (the claim's lease is live, or no step started without an outcome).
func UncertainStep(steps []receipts.StepRecord, abandoned bool) *receipts.StepRecord {
	if !abandoned {
		return nil
	}
	for i := range steps {
		if steps[i].State == receipts.Pending {
			return &steps[i]
		}
	}
	return nil
}

// retryGetsStep says what the next retry of the key gets after a step is settled by how.
func retryGetsStep(how StepSettlement) string {
	switch how.State {
	case receipts.Succeeded:
		return "the next retry resumes the action: it gets this result for the step without running it, and runs the steps after it"
	case receipts.Failed:
		return "the next retry resumes the action: it gets this result for the step as a definitive failure (ErrFailed) without running it"
	}
	return "the next retry resumes the action: it runs the step again as never started (not Recovered), with the same provider key"
}

// SettleStep settles the step named step of k's abandoned claim, the one whose outcome is
// unknown: it reads the record and its step journal, checks that the claim is still the
// attempt with token (when token is not 0), that it is abandoned and that step is the
// journal's step that started without an outcome, takes the claim over (fenced: nothing
// is written if another attempt came in since) and settles the step as how says
// (receipts.Lease.SettleStep). Then it abandons the claim again, so that the next retry
// takes it over and resumes the action. opts may give receipts.LeaseFor. Every refusal
// writes nothing.
func SettleStep(ctx context.Context, db *receipts.DB, k receipts.Key, token uint64, step string, how StepSettlement, opts ...receipts.ClaimOption) (StepOutcome, error) {
	if how.State != receipts.Succeeded && how.State != receipts.Failed && how.State != receipts.Pending {
		return StepOutcome{}, fmt.Errorf("%w: settle a step as succeeded (done), failed or pending (not done), not %s", ErrBadInput, how.State)
	}
	if len(how.Result) > receipts.MaxStepResultSize {
		return StepOutcome{}, fmt.Errorf("%w: a step result of %d bytes (at most %d)", ErrBadInput, len(how.Result), receipts.MaxStepResultSize)
	}
	r, err := db.Inspect(ctx, k)
	switch {
	case errors.Is(err, receipts.ErrNotFound):
		return StepOutcome{}, fmt.Errorf("%s: not found: no claim whose step to settle: %w", k, err)
	case err != nil:
		return StepOutcome{}, err
	case r.State != receipts.Pending:
		return StepOutcome{}, fmt.Errorf("%s is already settled (%s): no step to settle", k, r.State)
	case token != 0 && r.Token != token:
		return StepOutcome{}, fmt.Errorf("%s: the listed attempt (token %d) is gone; attempt %d (token %d) holds it now: nothing written",
			k, token, r.Attempts, r.Token)
	}
	steps, err := db.Steps(ctx, k)
	if err != nil {
		return StepOutcome{}, err
	}
	now, err := db.Now(ctx)
	if err != nil {
		return StepOutcome{}, err
	}
	if !r.Abandoned(now) {
		return StepOutcome{}, fmt.Errorf("%s: its holder's lease is live (attempt %d, token %d): its steps are running, not uncertain; nothing written", k, r.Attempts, r.Token)
	}
	u := UncertainStep(steps, true)
	switch {
	case u == nil && len(steps) == 0:
		return StepOutcome{}, fmt.Errorf("%s: the claim has no steps: settle the whole claim instead; nothing written", k)
	case u == nil:
		return StepOutcome{}, fmt.Errorf("%s: no step's outcome is unknown (its %d steps are recorded): settle the whole claim instead; nothing written", k, len(steps))
	case u.Name != step:
		return StepOutcome{}, fmt.Errorf("%s: step %q is not the uncertain one: step %d %q is; nothing written", k, step, u.Index, u.Name)
	}
	l, err := db.TakeOver(ctx, r, opts...)
	var ip *receipts.InProgressError
	switch {
	case errors.As(err, &ip):
		return StepOutcome{}, fmt.Errorf("%s: its holder's lease is live (attempt %d, token %d): it is not abandoned; try after %s: %w",
			k, r.Attempts, r.Token, ip.RetryAfter.Round(time.Millisecond), err)
	case errors.Is(err, receipts.ErrLeaseLost):
		return StepOutcome{}, fmt.Errorf("%s: another attempt took the claim, or it was settled, since it was read: nothing written: %w", k, err)
	case err != nil:
		return StepOutcome{}, err
	}
	out := StepOutcome{Key: k, Step: u.Name, Index: u.Index, ProviderKey: u.ProviderKey, Settled: how.Settled(), Attempts: l.Attempt(), Token: l.Token()}
	var result []byte
	if how.State != receipts.Pending {
		result = how.Result
	}
	serr := l.SettleStep(ctx, step, how.State, result)
	// Abandoned again either way: the next retry takes the claim over and resumes.
	if aerr := l.Abandon(context.WithoutCancel(ctx)); aerr != nil && serr == nil {
		return out, fmt.Errorf("%s: step %q settled, but abandoning the operator's lease failed: %w (the claim is abandoned when the lease runs out)", k, step, aerr)
	}
	if serr != nil {
		return StepOutcome{}, fmt.Errorf("%s: settling step %q: %w (the claim stays abandoned, the step uncertain)", k, step, serr)
	}
	return out, nil
}
