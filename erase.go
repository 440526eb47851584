package receipts

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"iter"
	"log/slog"
	"time"

	"github.com/receiptstore/receipts/driver"
)

// EraseStats is what DB.EraseScope did, and what the store keeps of a scope's erasure
// (DB.Erasures): no scope, no ID, no result.
type EraseStats struct {
	// ScopeID names the scope erased: DB.ScopeID, a keyed hash under the store's secret.
	ScopeID []byte
	// At is when the scope was erased (by the store's clock); erasing it again while its
	// erasure is in force keeps the first time.
	At time.Time
	// Until is when its erasure stops being in force: until then a claim of any key of the
	// scope gets ErrErased, and nothing runs. It is At + Retention + TombstoneWindow
	// (Retention alone with tombstones off): as long as a retry of any receipt erased could
	// still have found it, or its tombstone.
	Until time.Time
	// Records counts the records deleted (receipts, and claims pending or abandoned), by
	// every erasure of the scope.
	Records int64
	// KeyDestroyed: the Keyring destroyed the scope's key (KeyDestroyer), so its wrapped
	// data key cannot be opened again anywhere: backups and checkpoints included. False
	// with a Keyring that cannot (its backups stay readable with the key-encryption key),
	// or without a Keyring.
	KeyDestroyed bool

	count uint32 // the scope's erasures (driver.Erasure.Count): which data key generation went
}

// InForce reports whether the erasure is in force at now.
func (s EraseStats) InForce(now time.Time) bool { return now.Before(s.Until) }

// EraseScope erases every record of scope: receipts and their results, claims pending or
// abandoned, tombstones, and its data key (Options.Keyring), in one atomic step of the
// engine (a crash leaves the scope whole or erased), whose cost is a write per epoch (or a
// statement per table), not per record. Then, if the Keyring is a KeyDestroyer (package
// keyring's File is), it destroys the scope's key there too, so that no backup or
// Checkpoint taken before can decrypt the scope's results after.
//
// Afterwards nothing of the scope is readable through any API: Lookup, Inspect and Claim
// of its keys answer *ErasedError (ErrErased, which matches ErrExpired too, so that a
// service answers it as it answers an expired key: receipthttp 410 Gone, receiptmcp
// CodeExpired), Scan and Tombstones list nothing of it. A claim of any key of the scope
// gets ErrErased until EraseStats.Until, so erasure never turns a late retry into a second
// action; after that a claim is a new action. Leases of the scope held meanwhile are lost
// (ErrLeaseLost): their commits write nothing. What the store keeps is EraseStats (listed
// by Erasures): the scope's keyed hash, when, and how many records.
//
// It is idempotent: erasing a scope again while its erasure is in force deletes whatever
// was written since (nothing: claims are refused) and finishes what a crash interrupted
// (the key's destruction); GC also finishes interrupted destructions. It returns
// ErrInvalidKey for an empty or over-long scope, and ErrUnsupported on an engine that
// cannot erase.
func (db *DB) EraseScope(ctx context.Context, scope string) (EraseStats, error) {
	if err := db.enter(); err != nil {
		return EraseStats{}, err
	}
	defer db.exit()
	if scope == "" || len(scope) > MaxKeyPartLen {
		return EraseStats{}, fmt.Errorf("%w: scope of %d bytes", ErrInvalidKey, len(scope))
	}
	er, ok := db.eng.(driver.Eraser)
	if !ok {
		return EraseStats{}, fmt.Errorf("%w: EraseScope on the %s engine", ErrUnsupported, db.eng.Name())
	}
	if err := ctx.Err(); err != nil {
		return EraseStats{}, err
	}
	stored := db.storedScope(scope)
	e, err := er.EraseScope(ctx, stored)
	if err != nil {
		return EraseStats{}, fmt.Errorf("receipts: erase scope %x: %w", db.ScopeID(scope), err)
	}
	db.seal.Forget(stored)
	st := eraseStats(e)
	if err := db.destroyKey(ctx, er, &st); err != nil {
		return st, err
	}
	db.opts.Logger.LogAttrs(ctx, levelInfo, "receipts: scope erased", scopeAttrs(st)...)
	return st, nil
}

// destroyKey destroys the erased scope's key in the Keyring, if it can, and records that.
func (db *DB) destroyKey(ctx context.Context, er driver.Eraser, st *EraseStats) error {
	kd, ok := db.opts.Keyring.(KeyDestroyer)
	if !ok || st.KeyDestroyed {
		return nil
	}
	if err := kd.DestroyKey(ctx, db.seal.KeyringID(st.ScopeID, st.count-1)); err != nil {
		return fmt.Errorf("receipts: erase scope %x: its records are erased, but the Keyring did not destroy its key (erase it again): %w", st.ScopeID, err)
	}
	if err := er.MarkKeyDestroyed(ctx, st.ScopeID); err != nil {
		return fmt.Errorf("receipts: erase scope %x: its key is destroyed, but recording that failed: %w", st.ScopeID, err)
	}
	st.KeyDestroyed = true
	return nil
}

// finishErasures destroys, in the Keyring, the keys of erased scopes whose destruction a
// crash (or an error) interrupted. GC calls it.
func (db *DB) finishErasures(ctx context.Context) error {
	er, ok := db.eng.(driver.Eraser)
	if _, destroys := db.opts.Keyring.(KeyDestroyer); !ok || !destroys {
		return nil
	}
	var errs []error
	for e, err := range er.Erasures(ctx) {
		if err != nil {
			return err
		}
		if e.KeyDestroyed {
			continue
		}
		st := eraseStats(e)
		errs = append(errs, db.destroyKey(ctx, er, &st))
	}
	return errors.Join(errs...)
}

// Erasures lists what the store keeps of every scope erased: the erasure records, which GC
// never reclaims (a ledger that names no scope; DB.ScopeID names a scope as they do). It
// returns ErrUnsupported on an engine that cannot erase.
func (db *DB) Erasures(ctx context.Context) iter.Seq2[EraseStats, error] {
	return func(yield func(EraseStats, error) bool) {
		if err := db.enter(); err != nil {
			yield(EraseStats{}, err)
			return
		}
		defer db.exit()
		er, ok := db.eng.(driver.Eraser)
		if !ok {
			yield(EraseStats{}, fmt.Errorf("%w: Erasures on the %s engine", ErrUnsupported, db.eng.Name()))
			return
		}
		for e, err := range er.Erasures(ctx) {
			if !yield(eraseStats(e), err) {
				return
			}
		}
	}
}

func eraseStats(e driver.Erasure) EraseStats {
	return EraseStats{ScopeID: e.ID, At: e.At, Until: e.Until, Records: e.Records, KeyDestroyed: e.KeyDestroyed, count: e.Count}
}

// erasedScope returns the erasure in force of k's scope at now, if any: Lookup's answer
// for a key it does not find.
func (db *DB) erasedScope(ctx context.Context, k Key, now time.Time) (*ErasedError, error) {
	er, ok := db.eng.(driver.Eraser)
	if !ok {
		return nil, nil
	}
	e, found, err := er.Erasure(ctx, db.ScopeID(k.Scope))
	if err != nil || !found || !e.InForce(now) {
		return nil, err
	}
	return &ErasedError{Key: k, At: e.At, Until: e.Until, notFound: true, db: db}, nil
}

// ErasedError reports that Key's scope was erased (DB.EraseScope). It wraps ErrErased and
// ErrExpired (the key may have been used, and its receipt is gone), and, from Lookup,
// ErrNotFound.
type ErasedError struct {
	Key Key
	// At is when the scope was erased (zero for a result whose data key is gone).
	At time.Time
	// Until is when a claim of the key is a new action again.
	Until    time.Time
	notFound bool
	db       *DB
}

// Error says which key's scope was erased and until when its keys are refused. A store
// names the key by its keyed hash, unless Options.LogKeys is set.
func (e *ErasedError) Error() string {
	return fmt.Sprintf("%s: %s (its scope was erased at %s; its keys are refused until %s)",
		ErrErased, e.db.keyName(e.Key), e.At.UTC().Format(time.RFC3339Nano), e.Until.UTC().Format(time.RFC3339Nano))
}

// Unwrap returns ErrErased and ErrExpired, and ErrNotFound from Lookup.
func (e *ErasedError) Unwrap() []error {
	if e.notFound {
		return []error{ErrErased, ErrExpired, ErrNotFound}
	}
	return []error{ErrErased, ErrExpired}
}

const levelInfo = slog.LevelInfo

// scopeAttrs are what the log says of an erasure: never the scope.
func scopeAttrs(st EraseStats) []slog.Attr {
	return []slog.Attr{
		slog.String("scope_id", hex.EncodeToString(st.ScopeID)),
		slog.Int64("records", st.Records),
		slog.Time("until", st.Until),
		slog.Bool("key_destroyed", st.KeyDestroyed),
	}
}
