package receipts_test

import (
	"context"
	"errors"
	"testing"

	"github.com/receiptstore/receipts"
)

// TestStepUnknownAbandonsOnce: Do whose step's outcome is unknown abandons the
// claim once (the step does, and Do's conclusion does not again): Stats counts
// one abandon, and the next attempt is Recovered.
func TestStepUnknownAbandonsOnce(t *testing.T) {
	db, err := receipts.Open(t.TempDir(), &receipts.Options{GCInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	k := receipts.Key{Scope: "s", ID: "k"}
	_, err = db.Do(t.Context(), k, []byte("fp"), func(ctx context.Context, l *receipts.Lease) ([]byte, error) {
		return l.Step(ctx, "charge", nil, func(context.Context, *receipts.Step) ([]byte, error) {
			return nil, errors.New("timeout")
		})
	})
	if !errors.Is(err, receipts.ErrOutcomeUnknown) {
		t.Fatalf("Do = %v, want ErrOutcomeUnknown", err)
	}
	if n := db.Stats().Abandons; n != 1 {
		t.Fatalf("Stats().Abandons = %d after one unknown step, want 1", n)
	}
	recovered := false
	if _, err := db.Do(t.Context(), k, []byte("fp"), func(ctx context.Context, l *receipts.Lease) ([]byte, error) {
		return l.Step(ctx, "charge", nil, func(_ context.Context, s *receipts.Step) ([]byte, error) {
			recovered = s.Recovered()
			return []byte("ok"), nil
		})
	}); err != nil || !recovered {
		t.Fatalf("retry: %v, recovered %v", err, recovered)
	}
}
