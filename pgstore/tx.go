package pgstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/driver"
	"github.com/receiptstore/receipts/internal/mutate"
)

// CommitTx records l's operation as Succeeded with result inside the caller's transaction
// tx, so that the application's rows written in tx and the receipt commit together: the
// receipt commits if and only if tx commits. If tx rolls back (or never commits), nothing is
// recorded and l is still held: commit again in a new transaction, or Release or Abandon it.
// The returned receipt is what tx will hold once it commits. Waiters, on this node and on
// others, are woken once the engine sees tx committed.
//
// Call FenceTx at the start of tx, before the effect: then nobody can take l over while tx
// runs, and CommitTx cannot fail for that reason after the effect was written. CommitTx
// returns ErrLeaseLost if the lease was lost (roll tx back: another caller holds the key),
// ErrResultTooLarge, ErrClosed once the DB is closed, ErrUnsupported if l is not a
// PostgreSQL lease, or the database's error (a serialization failure: roll back and retry
// the transaction). tx must belong to the database the store lives in.
//
// Do not call CommitTx inside Do's or Lease.Run's fn (they record the outcome themselves):
// use DoTx. Stats counts the commit when CommitTx returns, whether or not tx then commits.
//
// tx's COMMIT is the caller's, so the engine cannot check it: with synchronous replication a
// COMMIT whose wait for the standby is cancelled succeeds with only a warning ("canceling
// wait for synchronous replication"), and a failover can lose it (docs/postgresql-ha.md):
// treat such a commit as an unknown outcome, as the engine treats its own.
func CommitTx(ctx context.Context, tx pgx.Tx, l *receipts.Lease, result []byte) (*receipts.Receipt, error) {
	if len(result) > receipts.MaxResultSize {
		return nil, errorf("pgstore: commit: %w: %d bytes (max %d)", receipts.ErrResultTooLarge, len(result), receipts.MaxResultSize)
	}
	if tx == nil || l == nil {
		return nil, errorf("pgstore: commit: %w: nil transaction or lease", receipts.ErrInvalidOptions)
	}
	return l.Raw(ctx, func(ctx context.Context, e driver.Engine, li driver.LeaseInfo) (*driver.Record, error) {
		pe, err := pgEngine(e)
		if err != nil {
			return nil, err
		}
		if li.Seal != nil { // Options.Keyring: the result is stored encrypted
			if result, err = li.Seal(withSealTx(ctx, &sealTx{tx: tx}), driver.Succeeded, result); err != nil {
				return nil, err
			}
		}
		rec, err := pe.finishTx(ctx, tx, li.Key, li.Token, driver.Succeeded, result)
		if err != nil {
			return nil, err
		}
		return &rec, nil
	})
}

// FenceTx fences the caller's own writes in tx with l's token, before the effect: it locks
// l's record in tx (SELECT … FOR UPDATE) and returns ErrLeaseLost if l is no longer the
// holder (roll tx back: write nothing). Once it has returned nil, and until tx ends, nobody
// can take l over, even after its lease has run out (a concurrent claim reports the key in
// progress), so the effect written in tx and CommitTx are safe from takeover.
//
// While tx holds the record, renewals of l wait for tx to end: stop Lease.KeepAlive's
// renewer (call its stop function) BEFORE FenceTx, never between FenceTx and the end of tx
// (stop waits for a renewal that waits for tx). A lease needs no renewal while tx holds it.
func FenceTx(ctx context.Context, tx pgx.Tx, l *receipts.Lease) error {
	if tx == nil || l == nil {
		return errorf("pgstore: fence: %w: nil transaction or lease", receipts.ErrInvalidOptions)
	}
	_, err := l.Raw(ctx, func(ctx context.Context, e driver.Engine, li driver.LeaseInfo) (*driver.Record, error) {
		pe, err := pgEngine(e)
		if err != nil {
			return nil, err
		}
		return nil, pe.fenceTx(ctx, tx, li.Key, li.Token)
	})
	return err
}

// DoTx performs the operation k at most once with its effect in PostgreSQL: the claim, fn's
// writes in tx and the receipt are one transaction, committed with one flush. A retry of a
// finished operation (on any node) gets its receipt and never calls fn; a duplicate that
// arrives while the transaction runs waits for it (claims of k wait on its lock until the
// transaction ends) and then replays its receipt; a duplicate of an operation held by a
// plain Claim waits as Do does (bounded by ctx).
//
// fn writes its effect in tx and returns the result to record. DoTx ends tx: its Commit and
// Rollback fail with an error wrapping receipts.ErrInvalidArgument, and once DoTx has
// returned its statements fail with pgx.ErrTxClosed (fn must not keep tx, nor its Conn or
// LargeObjects, beyond its return). fn should keep its effects in tx: one outside the
// database (an HTTP call) is not rolled back with it; use Claim, FenceTx and CommitTx for
// those. fn runs while DoTx holds one of the pool's connections: what fn sends outside tx
// (through the pool, or a Do on the same DB) needs another, so with as many DoTx callers as
// the pool has connections it waits until ctx ends. While the transaction is open nobody can
// take k over, so DoTx does not renew the lease; fn may take longer than LeaseTTL. fn's
// outcome is recorded by the contract's rules, as for Do (receipts.Lease.Run settles it, and
// this engine carries it out in tx):
//   - nil: the result is recorded as a Succeeded receipt, with the effects fn staged on the
//     lease (receipts.Lease.Stage), and tx commits.
//   - NotPerformed(err): tx is rolled back, the claim with it: the key is free (the next
//     attempt is Attempt 1, or, if this one took over an abandoned claim, takes that
//     claim over again, Recovered). DoTx returns an error wrapping err.
//   - Permanent(err): fn's writes are rolled back (to a savepoint taken after the claim)
//     and a Failed receipt is recorded (its result is what fn returned, or err's text); it
//     is returned with an error wrapping ErrFailed and err.
//   - any other error, or a panic: the outcome is unknown. fn's writes are rolled back to
//     the savepoint, and the claim is committed abandoned: fn held a lease with a
//     ProviderKey and may have reached beyond the transaction, so the next attempt takes
//     it over with Recovered() == true, as after Do. DoTx returns an error wrapping
//     receipts.ErrOutcomeUnknown and fn's error (a panic is re-raised). So does a result
//     larger than MaxResultSize, and a nil error over a transaction that one of fn's
//     statements aborted (it cannot commit).
//
// A first call costs two round trips besides fn's own statements: the claim batch begins
// the transaction, and the receipt's write is sent with the COMMIT (three if fn returns
// Permanent after one of its statements failed: the rollback to the savepoint goes first).
//
// The receipt is recorded and tx committed on a context detached from ctx once fn has
// returned, so a caller that goes away right after the effect does not lose its receipt. If
// the commit's reply is lost, DoTx reads the record back: it returns the receipt if the
// commit landed. If the commit did not land, the claim rolled back with it (the key is as
// it was before DoTx), and DoTx returns an error wrapping receipts.ErrOutcomeUnknown: what
// fn did outside the transaction is not known.
// A Failed receipt, the first time or replayed, comes with an error wrapping ErrFailed.
// Other errors: those of Claim, ErrUnsupported if db is not served by pgstore. opts are
// Claim's, as for Do (receipts.LeaseFor, receipts.WaitAtMost).
func DoTx(ctx context.Context, db *receipts.DB, k receipts.Key, fingerprint []byte,
	fn func(ctx context.Context, tx pgx.Tx, l *receipts.Lease) ([]byte, error), opts ...receipts.ClaimOption,
) (*receipts.Receipt, error) {
	if db == nil || fn == nil {
		return nil, errorf("pgstore: dotx: %w: nil DB or fn", receipts.ErrInvalidOptions)
	}
	var tx *txConn
	rollback := func() {
		tx.end(ctx)
		tx = nil
	}
	defer rollback() // also on a panic in fn: nothing happened
	nonce := newNonce()
	var pe *engine
	l, r, err := db.ClaimWith(ctx, k, fingerprint, func(ctx context.Context, e driver.Engine, req driver.ClaimRequest) (driver.ClaimResult, error) {
		var err error
		if pe, err = pgEngine(e); err != nil {
			return driver.ClaimResult{}, err
		}
		rollback() // an earlier claim of this call that was not granted
		var res driver.ClaimResult
		tx, res, err = pe.claimTx(ctx, req, nonce)
		return res, err
	}, append([]receipts.ClaimOption{receipts.WaitForResult()}, opts...)...)
	if err != nil {
		return nil, err
	}
	if r != nil {
		rollback()
		if r.State == receipts.Failed {
			return r, fmt.Errorf("receipts: %s: %w", db.KeyName(k), receipts.ErrFailed)
		}
		return r, nil
	}
	// The root's outcome protocol settles the lease (Lease.Run, as for Do); this engine
	// finishes, abandons or releases it in tx (effects.go).
	pe.bound.bind(l.Token(), tx)
	defer pe.bound.unbind(l.Token())
	fnTx := tx.fnTx()
	return l.Run(withSealTx(ctx, &sealTx{tx: tx.tx, ended: tx.ended.Load}), func(ctx context.Context, l *receipts.Lease) ([]byte, error) {
		return fn(withSealTx(ctx, nil), fnTx, l) // fn's own calls read through the pool
	})
}

// pgEngine is the DB's engine, if it is this package's.
func pgEngine(e driver.Engine) (*engine, error) {
	pe, ok := e.(*engine)
	if !ok {
		return nil, fmt.Errorf("%w: pgstore on the %s engine", receipts.ErrUnsupported, e.Name())
	}
	return pe, nil
}

// effectSavepoint is where DoTx's effect begins: a Permanent failure rolls back to it and
// records the Failed receipt on the claim.
const effectSavepoint = "receipts_effect"

// claimTx begins a transaction and claims req in it ([advisory lock; claim; SAVEPOINT] in one
// batch). A granted claim (Claimed, TookOver) comes back with the transaction open, holding
// the claim and the key's lock to its end; any other outcome with the transaction rolled
// back (tx nil). Busy rows, lost replies, serialization failures and missing partitions are
// retried in a new transaction with the same nonce, as Claim does.
func (e *engine) claimTx(ctx context.Context, req driver.ClaimRequest, nonce []byte) (*txConn, driver.ClaimResult, error) {
	if err := e.requireSyncStandby(); err != nil {
		return nil, driver.ClaimResult{}, errorf("pgstore: claim: %w", err)
	}
	if ep, seen := e.hint.get(keyHash(req.Key)); seen { // else probably a first call: the claim transaction (its claim statement answers a finished record too)
		if res, ok := e.replayFast(ctx, req, ep); ok { // a finished record: one plain read, no transaction
			return nil, res, nil
		}
	}
	busy, other := 0, 0
	for {
		if e.closing() {
			return nil, driver.ClaimResult{}, errorf("pgstore: claim: %w", driver.ErrClosed)
		}
		tx, row, err := e.claimTxOnce(ctx, req, nonce)
		if err == nil && row.outcome != "busy" {
			res, err := e.claimResult(req, row)
			if err != nil || (res.Outcome != driver.Claimed && res.Outcome != driver.TookOver) {
				tx.end(ctx)
				return nil, res, err
			}
			if e.closing() { // decided after its time was taken; nothing is committed yet
				tx.end(ctx)
				return nil, driver.ClaimResult{}, errorf("pgstore: claim: %w", driver.ErrClosed)
			}
			return tx, res, nil
		}
		tx.end(ctx)
		switch {
		case erasedCode(err): // the scope's check: an erasure in force (erase.go)
			res, err := e.erasedClaim(ctx, req)
			return nil, res, err
		case err == nil: // busy: a writer holds the row
			if busy++; busy > maxBusy {
				return nil, driver.ClaimResult{Outcome: driver.InProgress, Record: row.rec, Now: row.now}, nil
			}
			if err := sleep(ctx, time.Millisecond<<min(busy-1, 4)); err != nil {
				return nil, driver.ClaimResult{}, err
			}
		case retryable(err) || errors.Is(err, pgx.ErrNoRows) || uniqueViolation(err) || noPartition(err) || lostReply(ctx, err):
			if other++; other > maxOther {
				return nil, driver.ClaimResult{}, errorf("pgstore: claim: %w", err)
			}
			if noPartition(err) {
				if err := e.ensureCurrent(ctx); err != nil {
					return nil, driver.ClaimResult{}, err
				}
			} else if lostReply(ctx, err) {
				if err := sleep(ctx, 10*time.Millisecond<<min(other-1, 5)); err != nil {
					return nil, driver.ClaimResult{}, err
				}
			}
		default:
			return nil, driver.ClaimResult{}, errorf("pgstore: claim: %w", err)
		}
	}
}

// claimTxOnce is one transaction of claimTx, on a connection of its own. The fresh batch
// begins it ([BEGIN; fresh; SAVEPOINT], one round trip: sendFresh; the fresh statement
// takes the key's lock and the scope's and checks the erasures): a key with no record
// in the live partitions is claimed by a plain INSERT, and a finished record still visible is
// answered from the same read (replayable), as Do's first call does. Only a key with another
// record (or a tombstone in force) sends the claim statement, in the same transaction
// ([claim; SAVEPOINT]: the transaction holds the locks, and the effect's savepoint is the one
// taken after the claim). tx is nil if err is not.
//
// Measured (bench/README.md, "DoTx against pg-tx-floor"): the claim statement's plan (its
// takeover, row lock and tombstone branches over every live partition) cost the server about
// 300 µs of CPU per first call at 64 callers, most of it setting the plan up (ExecutorStart).
func (e *engine) claimTxOnce(ctx context.Context, req driver.ClaimRequest, nonce []byte) (*txConn, claimRow, error) {
	c, err := e.pool.Acquire(ctx)
	if err != nil {
		return nil, claimRow{}, err
	}
	t := &txConn{c: c, keyLocked: true} // the claim batch takes the key's lock first
	row, got, tx, err := e.sendFresh(ctx, c, req, nonce, true, "SAVEPOINT "+effectSavepoint)
	t.tx = tx
	if err == nil && got == freshExisting {
		if done, ok := replayable(req, row); ok {
			return t, done, nil // not granted: claimTx ends the transaction
		}
	}
	if err == nil && got != freshClaimed { // the claim statement decides, in the same transaction
		row, err = e.claimSend(ctx, tx, req, nonce, "SAVEPOINT "+effectSavepoint)
		for n := 0; errors.Is(err, pgx.ErrNoRows) && n < maxOther; n++ { // READ COMMITTED: re-send in tx
			row, err = e.claimSend(ctx, tx, req, nonce, "SAVEPOINT "+effectSavepoint)
		}
	}
	if err != nil {
		t.end(ctx)
		return nil, row, err
	}
	return t, row, nil
}

// commitDoTx records state and result on the claim li made in tx and commits tx. A Failed
// outcome first rolls fn's writes back to the savepoint. If the commit's reply is lost, the
// record says whether it landed.
//
// One round trip: [ROLLBACK TO SAVEPOINT (Failed only); the key's advisory lock (unless tx
// holds it already: FinishWith's); finish; COMMIT] in one batch. The
// finish statement fails if its fence does not hold (finishMust: no row would otherwise let
// the COMMIT after it commit the effect with the claim still Pending), and a statement that
// fails makes the server skip the rest of the batch: then nothing is committed.
//
// Two round trips if fn left the transaction aborted (one of its statements failed) and
// returned Permanent: the server prepares no statement in an aborted transaction but the
// savepoint's rollback, and pgx prepares a batch's statements that its connection has not
// prepared yet before it sends the batch. So the rollback goes alone, first. If fn left it
// aborted and returned no error, nothing is sent: the transaction cannot commit.
func (e *engine) commitDoTx(ctx context.Context, tx *txConn, li driver.LeaseInfo, state driver.State, result []byte) (driver.Record, error) {
	defer tx.end(ctx) // rolls back unless committed; hands the connection back
	if result == nil {
		result = []byte{}
	}
	e.leases.drop(li.Token)
	var ferr error // the effect's rollback or the receipt's write failed
	b := &pgx.Batch{}
	batched := false                                  // the rollback is the batch's first statement
	aborted := tx.c.Conn().PgConn().TxStatus() == 'E' // a statement of fn's failed
	switch {
	case state == driver.Failed && aborted:
		_, ferr = tx.tx.Exec(ctx, "ROLLBACK TO SAVEPOINT "+effectSavepoint, pgx.QueryExecModeSimpleProtocol)
	case state == driver.Failed:
		b.Queue("ROLLBACK TO SAVEPOINT " + effectSavepoint)
		batched = true
	case aborted: // the server would refuse the receipt's write and roll back the COMMIT
		return driver.Record{}, errors.New("pgstore: dotx: rolled back, nothing happened: fn returned no error, but a statement it ran in tx failed and aborted the transaction")
	}
	if ferr != nil {
		return driver.Record{}, errorf("pgstore: dotx: rolled back, nothing happened: roll back the effect: %w", ferr)
	}
	if !tx.keyLocked { // held to the end, so that a read-back after a lost reply waits for it
		b.Queue(e.q.lock, lockClass, lockID(keyHash(li.Key)))
	}
	b.Queue(e.q.finishMust, e.fencedArgs(li.Key, li.Token, int16(state), result, driver.TraceOf(ctx))...)
	b.Queue("COMMIT")
	var fin driver.Record
	err := e.checkedCommit(tx.c.Conn().PgConn(), func() error {
		br := tx.tx.SendBatch(ctx, b)
		if batched {
			if _, ferr = br.Exec(); ferr != nil {
				ferr = fmt.Errorf("roll back the effect: %w", ferr)
			}
		}
		if ferr == nil && !tx.keyLocked {
			_, ferr = br.Exec()
		}
		if ferr == nil {
			var now time.Time
			var xid string
			if ferr = batchRecord(br, &fin, &now, &xid); ferr == nil {
				fin.Key = li.Key
				e.fill(&fin)
				e.saw(now, nil)
			} else if divisionByZero(ferr) { // finishMust: the fence did not hold
				ferr = driver.ErrLeaseLost
			}
		}
		_, err := br.Exec() // COMMIT (skipped by the server after a failed statement: its error again)
		if cerr := br.Close(); err == nil {
			err = cerr
		}
		return err
	})
	if err == nil && tx.c.Conn().PgConn().TxStatus() != 'I' { // pgx would have said, but be sure
		err = errors.New("the transaction is still open after COMMIT")
	}
	switch {
	case errors.Is(err, ErrNotReplicated): // committed on the primary only: the outcome is unknown
		return driver.Record{}, errorf("pgstore: dotx: outcome unknown: %w", err)
	case err == nil && ferr == nil:
		e.wakeFinished(li.Key, fin)
		return fin, nil
	case err == nil: // COMMIT ran, but the receipt's write answered nothing readable: the record says
	case lostReply(ctx, err):
	case ferr != nil:
		return driver.Record{}, errorf("pgstore: dotx: rolled back, nothing happened: %w", ferr)
	default:
		return driver.Record{}, errorf("pgstore: dotx: commit: rolled back, nothing happened: %w", err)
	}
	// The record is read on another connection: hand this one back first. ctx has no
	// deadline, and on a pool whose every connection is held like this one (a pool of one,
	// or a server restart under DoTx load) the read would otherwise wait for ever. It is
	// read once the transaction has ended on the server (settledLookup).
	tx.end(ctx)
	cur, found, lerr := e.settledLookup(ctx, li.Key)
	switch {
	case found && finished(li.Token, state, result)(cur):
		if derr := e.confirmDurable(ctx); derr != nil { // it may be on the primary only
			return driver.Record{}, errorf("pgstore: dotx: outcome unknown: the receipt was read back, but %w", derr)
		}
		e.wakeFinished(li.Key, cur)
		return cur, nil
	case err == nil: // committed without its receipt: the claim stays Pending until its lease ends
		return driver.Record{}, errorf("pgstore: dotx: committed, but the receipt was not written, outcome unknown: %w (%v)", ferr, lerr)
	case lerr != nil:
		return driver.Record{}, errorf("pgstore: dotx: commit reply lost and the record cannot be read, outcome unknown: %w (%w)", err, lerr)
	}
	return driver.Record{}, errorf("pgstore: dotx: commit did not land, nothing happened: %w", err)
}

// settleWait bounds how long a read-back after a lost COMMIT reply waits for the transaction
// to end on the server (settledLookup): a server that has not noticed its client is gone (a
// half-open connection) keeps the transaction open until TCP keepalive tells it.
const settleWait = time.Minute

// errUnsettled: the transaction whose COMMIT reply was lost was still open on the server
// after settleWait.
var errUnsettled = errors.New("its transaction is still open on the server")

// settledLookup reads k's record, as Lookup does, once no transaction holds k's advisory lock
// (lockClass, lockID: taken shared, in a transaction of its own, before the read). DoTx's
// transaction takes it with the claim, and FinishWith's first in its commit batch ([lock;
// finish; COMMIT]: commitDoTx), and each holds it to its end, which the server makes visible
// before it releases the lock. So after a lost COMMIT reply the read sees whether that COMMIT
// landed: it waits while the server is still committing (a slow flush, a wait for the
// synchronous standby, deferred triggers) or has yet to roll the transaction back (its
// connection gone), and its snapshot comes after. (FinishWith's batch, if the server has not
// even begun it, is not waited for: its transaction holds only the record's row lock then.)
// Read at once instead, it found the claim still Pending (or absent) while the COMMIT was
// finishing, and DoTx answered "did not land, nothing happened" for a receipt and effect
// that had committed (issue 43, item 7). It waits settleWait at most: then errUnsettled.
func (e *engine) settledLookup(ctx context.Context, k driver.Key) (driver.Record, bool, error) {
	var rec driver.Record
	var now time.Time
	var err, lerr error
	for attempt := 0; ; attempt++ {
		err = pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
			b := &pgx.Batch{}
			b.Queue(fmt.Sprintf("SET LOCAL lock_timeout = %d", settleWait.Milliseconds()))
			if mutate.Name != mutate.PgReadNow {
				b.Queue(`SELECT pg_advisory_xact_lock_shared($1::int4, $2::int4)`, lockClass, lockID(keyHash(k)))
			}
			if err := tx.SendBatch(ctx, b).Close(); err != nil {
				return err
			}
			rec, now, lerr = e.lookupOn(ctx, tx, k)
			if errors.Is(lerr, errAbsent) {
				return nil
			}
			return lerr
		})
		if pgCode(err) == "55P03" { // lock_not_available: lock_timeout
			return driver.Record{}, false, fmt.Errorf("%w after %v", errUnsettled, settleWait)
		}
		if attempt >= maxLostReply || !lostReply(ctx, err) || sleep(ctx, 10*time.Millisecond<<min(attempt, 5)) != nil {
			break
		}
	}
	if err != nil {
		return driver.Record{}, false, errorf("pgstore: lookup: %w", err)
	}
	cur, found, _, err := e.lookedUp(k, rec, now, lerr)
	return cur, found, err
}
