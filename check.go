package receipts

import (
	"context"
	"fmt"
	"time"

	"github.com/receiptstore/receipts/driver"
	"github.com/receiptstore/receipts/internal/progress"
)

// CheckReport is what Check found in a store.
type CheckReport struct {
	// Records is the number of record keys (PostgreSQL: rows) read, Epochs
	// the number of distinct epochs (partitions) holding them, Expired the
	// records past retention that GC has not dropped yet.
	Records, Epochs, Expired int
	// EpochWidth is the width the store's meta data records (0 if it is
	// unreadable).
	EpochWidth time.Duration
	// GCFloor: epochs below it were dropped by GC. TokenCeiling: no fencing
	// token at or above it was handed out.
	GCFloor, TokenCeiling uint64
	// Problems lists what is wrong, in storage order; empty if nothing is.
	Problems []Problem
}

// OK reports whether the check found no problem.
func (r *CheckReport) OK() bool { return len(r.Problems) == 0 }

// Problem is one thing wrong in a store.
type Problem struct {
	// Key names what is wrong: a record's key as Key.String formats it, a
	// stored key that does not parse (Go-quoted), or a part of the store
	// such as "meta", "token ceiling" or "gc floor".
	Key string
	// Epoch is the epoch (partition) the record is stored in; -1 if the
	// problem is not in one.
	Epoch int64
	// What says what is wrong, for people.
	What string
}

// Check verifies the store's integrity and reports what is wrong: every
// record is read and decoded (version, checksum, fields) and checked
// against the key it is stored under, the epoch layout and the store's meta
// data (on Pebble: the epoch matches the record's last write and is not
// below the GC floor, no token is at or above the token ceiling, no key is
// visible twice, no unknown key uses the store's prefix). A problem found is
// in the report, not an error; the error is for what stops the check (ctx,
// I/O, Close). It reads one consistent view of a live store, taking no lock
// that writers wait for, in one pass (about as long as Count). An engine that
// cannot check itself returns ErrUnsupported (see the engine's docs). A
// progress callback in ctx (WithProgress) is told the records checked so
// far, every 1024 records, on the engines that count them (Pebble).
func (db *DB) Check(ctx context.Context) (*CheckReport, error) {
	if err := db.enter(); err != nil {
		return nil, err
	}
	defer db.exit()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	c, ok := db.eng.(driver.Checker)
	if !ok {
		return nil, fmt.Errorf("%w: Check on the %s engine", ErrUnsupported, db.eng.Name())
	}
	dr, err := c.Check(ctx)
	if err != nil {
		return nil, err
	}
	r := &CheckReport{
		Records: dr.Records, Epochs: dr.Epochs, Expired: dr.Expired,
		EpochWidth: dr.EpochWidth, GCFloor: dr.GCFloor, TokenCeiling: dr.TokenCeiling,
		Problems: make([]Problem, len(dr.Problems)),
	}
	for i, p := range dr.Problems {
		r.Problems[i] = Problem(p)
	}
	return r, nil
}

// WithProgress returns a copy of ctx that carries fn: a long read made with
// it (Check) tells fn how many records it has done so far, from the
// goroutine that reads, now and then. fn must return quickly.
func WithProgress(ctx context.Context, fn func(records int)) context.Context {
	return progress.With(ctx, fn)
}
