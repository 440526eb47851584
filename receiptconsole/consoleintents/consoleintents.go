// Package consoleintents gives the operators' console (package receiptconsole) a host's
// journal of approved actions (package intents), for its Host half page:
//
//	mux.Handle("/admin/console/", receiptconsole.Handler(db, &receiptconsole.Options{
//		Journal: consoleintents.Journal(journal),
//	}))
//
// It is a package of its own so that a console without a journal links none.
package consoleintents

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"strings"
	"time"

	"github.com/receiptstore/receipts/intents"
	"github.com/receiptstore/receipts/receiptconsole"
)

// Journal adapts j for receiptconsole.Options.Journal.
func Journal(j *intents.Journal) receiptconsole.Journal { return journal{j} }

type journal struct{ j *intents.Journal }

func (a journal) Actions(ctx context.Context, state string) iter.Seq2[*receiptconsole.Action, error] {
	return func(yield func(*receiptconsole.Action, error) bool) {
		st, err := intents.ParseState(state)
		if err != nil {
			yield(nil, err)
			return
		}
		for act, err := range a.j.List(ctx, st) {
			if err != nil {
				yield(nil, err)
				return
			}
			if !yield(action(act), nil) {
				return
			}
		}
	}
}

func (a journal) Action(ctx context.Context, key string) (*receiptconsole.Action, error) {
	act, err := a.j.Get(ctx, key)
	if err != nil {
		return nil, wrap(err)
	}
	return action(act), nil
}

func (a journal) Redeliver(ctx context.Context, key string, within time.Duration) error {
	_, err := a.j.Redeliver(ctx, key, a.j.Now().Add(within))
	return wrap(err)
}

func (a journal) Settle(ctx context.Context, key string, succeeded bool, by string, found []byte) error {
	st := intents.Failed
	if succeeded {
		st = intents.Succeeded
	}
	_, err := a.j.Settle(ctx, key, st, by, found)
	return wrap(err)
}

func (a journal) Forget(ctx context.Context, key string) error { return wrap(a.j.Forget(ctx, key)) }

// wrap adds the console's sentinel to the journal's errors it tells apart.
func wrap(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, intents.ErrNotFound):
		return fmt.Errorf("%w: %w", receiptconsole.ErrNoAction, err)
	case errors.Is(err, intents.ErrWrongState):
		return fmt.Errorf("%w: %w", receiptconsole.ErrActionState, err)
	case errors.Is(err, intents.ErrInvalid):
		return fmt.Errorf("%w: %w", receiptconsole.ErrBadInput, err)
	}
	return err
}

// action is what the page shows of a.
func action(a *intents.Action) *receiptconsole.Action {
	out := &receiptconsole.Action{Key: a.Key, Target: a.Target, Operation: a.Operation, ApprovedBy: a.ApprovedBy,
		State: a.State.String(), ApprovedAt: a.ApprovedAt, Deadline: a.Deadline, UpdatedAt: a.UpdatedAt,
		Attempts: a.Attempts, LastError: a.LastError, UncertainStep: a.UncertainStep}
	if ans := a.Answer; ans != nil {
		var parts []string
		if ans.Status != 0 {
			parts = append(parts, fmt.Sprintf("HTTP %d", ans.Status))
		}
		if ans.Code != "" {
			parts = append(parts, ans.Code)
		}
		if ans.SettledBy != "" {
			parts = append(parts, "settled by "+ans.SettledBy)
		}
		out.Answer = strings.Join(parts, ", ")
	}
	return out
}
