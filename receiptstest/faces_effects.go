package receiptstest

import (
	"context"
	"errors"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/pebblestore"
	"github.com/stretchr/testify/require"
)

// Effects is a capability a Store may have: it writes the application's own
// data into the store's database, inside the engine's unit of atomic work
// (receipts.Effect), and reads it back. The front-end suites use it to
// check that an effect a handler stages (Attempt.Stage) commits with the
// receipt, both or neither. Without it, those tests use DB.Pebble on the
// Pebble engine (an effect on the *pebble.Batch), and skip on others.
type Effects interface {
	// Effect returns an effect that records name in the database of the
	// store db is a handle of, in the engine's unit of atomic work (a row
	// inserted in the pgx.Tx, say). It is called on the test's goroutine
	// before the effect is staged; the effect runs when the lease commits.
	Effect(t testing.TB, db *receipts.DB, name string) receipts.Effect
	// HasEffect reports whether an effect recorded name and committed,
	// read through db.
	HasEffect(t testing.TB, db *receipts.DB, name string) bool
}

// errEffect is the error of an effect that fails after it wrote.
var errEffect = errors.New("receiptstest: the staged effect failed")

// effects makes the effects of f's tests, and reads them back.
type effects struct {
	f *faceEnv
	x Effects // nil: the Pebble engine's own
}

// newEffects returns f's effects, skipping the test if the engine has no
// unit of atomic work the kit knows how to write to.
func newEffects(t *testing.T, f *faceEnv) *effects {
	if x, ok := f.store.(Effects); ok {
		return &effects{f: f, x: x}
	}
	if pebblestore.DB(f.db) == nil {
		t.Skip("the Store does not implement receiptstest.Effects and the engine is not Pebble: no effect to stage")
	}
	return &effects{f: f}
}

// pebbleEffectKey is where the Pebble form of effect name writes.
func pebbleEffectKey(name string) []byte { return []byte("receiptstest/effect/" + name) }

// make returns the effect that records name; if fail, it records name and
// then returns errEffect, so that its write must be rolled back.
func (x *effects) make(t testing.TB, name string, fail bool) receipts.Effect {
	t.Helper()
	var e receipts.Effect
	if x.x != nil {
		e = x.x.Effect(t, x.f.db, name)
	} else {
		e = receipts.EffectOn(func(_ context.Context, b *pebble.Batch) error {
			return b.Set(pebbleEffectKey(name), []byte(name), nil)
		})
	}
	if !fail {
		return e
	}
	return func(ctx context.Context, tx any) error {
		if err := e(ctx, tx); err != nil {
			return err
		}
		return errEffect
	}
}

// has reports whether name's effect committed, as each node reads it.
func (x *effects) has(t testing.TB, name string) bool {
	t.Helper()
	var got []bool
	for _, db := range []*receipts.DB{x.f.db, x.f.b} {
		if x.x != nil {
			got = append(got, x.x.HasEffect(t, db, name))
			continue
		}
		_, closer, err := pebblestore.DB(db).Get(pebbleEffectKey(name))
		if errors.Is(err, pebble.ErrNotFound) {
			got = append(got, false)
			continue
		}
		require.NoError(t, err)
		require.NoError(t, closer.Close())
		got = append(got, true)
	}
	require.Equal(t, got[0], got[1], "the nodes disagree on effect %s", name)
	return got[0]
}
