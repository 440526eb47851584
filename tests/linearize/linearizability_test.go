package linearize_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/internal/testkit"
	"github.com/receiptstore/receipts/pebblestore"
	"github.com/receiptstore/receipts/receiptstest"
	"github.com/stretchr/testify/require"
)

const (
	linClients      = 8
	linOpsPerClient = 300
	linOpsPerEra    = 30
	linTTL          = 10 * time.Second
	// Retention and TombstoneWindow are short, so that the clock moves past
	// them between eras: a retry past retention gets ErrExpired, one past
	// the window is a new action.
	linRetention = 4 * linTTL
	linWindow    = 2 * linRetention
)

// modelBase is where the fake clock starts, in nanoseconds.
var modelBase = receiptstest.DefaultStart.UnixNano()

func linHistories() int {
	switch {
	case testkit.Soak():
		return 2000
	case testkit.RaceEnabled:
		return 12
	}
	return 100
}

type linOpKind uint8

const (
	linClaim linOpKind = iota + 1
	linCommit
	linFail
	linRelease
	linRenew
	linLookup
)

var linOpNames = map[linOpKind]string{linClaim: "claim", linCommit: "commit", linFail: "fail", linRelease: "release", linRenew: "renew", linLookup: "lookup"}

type linInput struct {
	op     linOpKind
	key    int
	fp     string
	token  uint64 // lease operations
	result string // commit, fail
	now    int64  // the era's clock
}

type linOutKind uint8

const (
	outLease linOutKind = iota + 1
	outReceipt
	outInProgress
	outMismatch
	outOK
	outLeaseLost
	outNotFound
	outExpired
	outError
)

var linOutNames = map[linOutKind]string{outLease: "lease", outReceipt: "receipt", outInProgress: "in-progress", outMismatch: "mismatch", outOK: "ok", outLeaseLost: "lease-lost", outNotFound: "not-found", outExpired: "expired", outError: "error"}

type linOutput struct {
	kind      linOutKind
	token     uint64
	attempt   uint32
	recovered bool
	state     receipts.State
	fp        string
	result    string
	retry     time.Duration
	leaseExp  int64
	err       string
}

// linState is one key's model state. It is a comparable value.
type linState struct {
	state    receipts.State // 0: absent
	fp       string
	token    uint64
	attempts uint32
	leaseExp int64
	updated  int64 // last write: visible until updated + linRetention
	result   string
	maxToken uint64 // tokens of this key only grow
}

func linStep(st, in, out any) (bool, any) {
	s, i, o := st.(linState), in.(linInput), out.(linOutput)
	if s.state != 0 && i.now >= s.updated+int64(linRetention) { // past retention
		if i.now < s.updated+int64(linRetention+linWindow) { // a tombstone
			switch i.op {
			case linClaim, linLookup:
				return o.kind == outExpired, s
			default:
				return o.kind == outLeaseLost, s
			}
		}
		s = linState{maxToken: s.maxToken} // past the window: absent
	}
	holds := s.state == receipts.Pending && s.token == i.token
	switch i.op {
	case linClaim:
		switch {
		case s.state == 0:
			if o.kind != outLease || o.attempt != 1 || o.recovered || o.token <= s.maxToken {
				return false, s
			}
			return true, linState{state: receipts.Pending, fp: i.fp, token: o.token, attempts: 1, leaseExp: i.now + int64(linTTL), updated: i.now, maxToken: o.token}
		case s.fp != i.fp:
			return o.kind == outMismatch, s
		case s.state != receipts.Pending:
			return o.kind == outReceipt && o.state == s.state && o.result == s.result && o.token == s.token && o.attempt == s.attempts && o.fp == s.fp, s
		case i.now < s.leaseExp:
			return o.kind == outInProgress && o.retry > 0 && o.retry <= time.Duration(s.leaseExp-i.now), s // RetryAfter is an estimate, bounded by the lease
		}
		if o.kind != outLease || o.attempt != s.attempts+1 || !o.recovered || o.token <= s.maxToken {
			return false, s
		}
		s.token, s.attempts, s.leaseExp, s.maxToken, s.updated = o.token, s.attempts+1, i.now+int64(linTTL), o.token, i.now
		return true, s
	case linCommit, linFail:
		if !holds {
			return o.kind == outLeaseLost, s
		}
		want := receipts.Succeeded
		if i.op == linFail {
			want = receipts.Failed
		}
		if o.kind != outReceipt || o.state != want || o.result != i.result || o.token != s.token || o.attempt != s.attempts {
			return false, s
		}
		s.state, s.result, s.leaseExp, s.updated = want, i.result, 0, i.now
		return true, s
	case linRelease:
		if !holds {
			return o.kind == outLeaseLost, s
		}
		if s.attempts > 1 { // a Recovered lease: the claim stays, abandoned
			s.leaseExp, s.updated = i.now, i.now
			return o.kind == outOK, s
		}
		return o.kind == outOK, linState{maxToken: s.maxToken}
	case linRenew:
		if !holds {
			return o.kind == outLeaseLost, s
		}
		s.leaseExp, s.updated = max(s.leaseExp, i.now+int64(linTTL)), i.now
		return o.kind == outOK, s
	case linLookup:
		if s.state == 0 {
			return o.kind == outNotFound, s
		}
		return o.kind == outReceipt && o.state == s.state && o.fp == s.fp && o.result == s.result &&
			o.token == s.token && o.attempt == s.attempts && o.leaseExp == s.leaseExp, s
	}
	return false, s
}

var linModel = porcupine.Model{
	Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
		byKey := map[int][]porcupine.Operation{}
		for _, op := range history {
			k := op.Input.(linInput).key
			byKey[k] = append(byKey[k], op)
		}
		out := make([][]porcupine.Operation, 0, len(byKey))
		for _, ops := range byKey {
			out = append(out, ops)
		}
		return out
	},
	Init: func() any { return linState{} },
	Step: linStep,
	DescribeOperation: func(in, out any) string {
		i, o := in.(linInput), out.(linOutput)
		s := fmt.Sprintf("%s(k%d", linOpNames[i.op], i.key)
		switch i.op {
		case linClaim:
			s += " fp=" + i.fp
		case linCommit, linFail:
			s += fmt.Sprintf(" tok=%d %q", i.token, i.result)
		case linRelease, linRenew:
			s += fmt.Sprintf(" tok=%d", i.token)
		}
		s += fmt.Sprintf(" t=%ds) -> %s", (i.now-modelBase)/int64(time.Second), linOutNames[o.kind])
		switch o.kind {
		case outLease:
			s += fmt.Sprintf(" tok=%d att=%d rec=%v", o.token, o.attempt, o.recovered)
		case outReceipt:
			s += fmt.Sprintf(" %s tok=%d att=%d %q", o.state, o.token, o.attempt, o.result)
		case outInProgress:
			s += " retry=" + o.retry.String()
		case outError:
			s += " " + o.err
		}
		return s
	},
	DescribeState: func(st any) string {
		s := st.(linState)
		if s.state == 0 {
			return fmt.Sprintf("absent (max tok %d)", s.maxToken)
		}
		return fmt.Sprintf("%s tok=%d att=%d exp=%ds %q", s.state, s.token, s.attempts, (s.leaseExp-modelBase)/int64(time.Second), s.result)
	},
}

func linReceiptOut(r *receipts.Receipt) linOutput {
	o := linOutput{kind: outReceipt, state: r.State, fp: string(r.Fingerprint), result: string(r.Result), token: r.Token, attempt: r.Attempts}
	if !r.LeaseExpiresAt.IsZero() {
		o.leaseExp = r.LeaseExpiresAt.UnixNano()
	}
	return o
}

func linErrOut(err error) linOutput {
	var ipe *receipts.InProgressError
	switch {
	case errors.As(err, &ipe):
		return linOutput{kind: outInProgress, retry: ipe.RetryAfter}
	case errors.Is(err, receipts.ErrIntentMismatch):
		return linOutput{kind: outMismatch}
	case errors.Is(err, receipts.ErrLeaseLost):
		return linOutput{kind: outLeaseLost}
	case errors.Is(err, receipts.ErrExpired): // before ErrNotFound: Lookup's matches both
		return linOutput{kind: outExpired}
	case errors.Is(err, receipts.ErrNotFound):
		return linOutput{kind: outNotFound}
	}
	return linOutput{kind: outError, err: err.Error()}
}

// linHistory runs one history on a fresh store and returns its operations
// and every token granted.
func linHistory(t *testing.T, seed uint64) ([]porcupine.Operation, []uint64) {
	var clock atomic.Int64
	clock.Store(modelBase)
	db, err := pebblestore.Open("db", &pebblestore.Options{
		Options: receipts.Options{
			Retention:       linRetention,
			TombstoneWindow: linWindow,
			LeaseTTL:        linTTL,
			GCInterval:      -1,
			Now:             func() time.Time { return time.Unix(0, clock.Load()) },
		},
		ReplayCacheSize: []int64{0, -1, 512}[seed%3],
		Pebble:          &pebble.Options{FS: vfs.NewMem()},
	})
	require.NoError(t, err)
	defer func() { require.NoError(t, db.Close()) }()

	ctx := context.Background()
	var seq atomic.Int64 // porcupine's call and return times
	var mu sync.Mutex
	var ops []porcupine.Operation
	var tokens []uint64
	type held struct {
		l   *receipts.Lease
		key int
	}
	leases := make([][]held, linClients)
	rngs := make([]*rand.Rand, linClients)
	for c := range rngs {
		rngs[c] = rand.New(rand.NewPCG(seed, uint64(c)))
	}
	eraRNG := rand.New(rand.NewPCG(seed, 1<<32))

	for era := 0; era < linOpsPerClient/linOpsPerEra; era++ {
		now := clock.Load()
		// Four keys, sliding by two each era: half are new, half carry the
		// previous era's leases and receipts.
		base := era * 2
		var wg sync.WaitGroup
		for c := 0; c < linClients; c++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rng := rngs[c]
				for range linOpsPerEra {
					in := linInput{now: now, key: base + rng.IntN(4)}
					var lease *receipts.Lease
					mine := leases[c]
					r := rng.IntN(100)
					if len(mine) > 0 && r < 55 {
						h := mine[len(mine)-1]
						if rng.IntN(4) == 0 {
							h = mine[rng.IntN(len(mine))]
						}
						lease, in.key, in.token = h.l, h.key, h.l.Token()
						switch {
						case r < 12:
							in.op, in.result = linCommit, fmt.Sprintf("c%d-%d", c, seq.Load())
						case r < 15:
							in.op, in.result = linFail, fmt.Sprintf("f%d-%d", c, seq.Load())
						case r < 35:
							in.op = linRelease
						default:
							in.op = linRenew
						}
					} else if r < 85 {
						in.op, in.fp = linClaim, "fp"
						if rng.IntN(80) == 0 {
							in.fp = "other"
						}
					} else {
						in.op = linLookup
					}
					k := receipts.Key{Scope: "s", ID: fmt.Sprintf("k%d", in.key)}
					var out linOutput
					call := seq.Add(1)
					switch in.op {
					case linClaim:
						l, rc, err := db.Claim(ctx, k, []byte(in.fp))
						switch {
						case err != nil:
							out = linErrOut(err)
						case l != nil:
							out = linOutput{kind: outLease, token: l.Token(), attempt: l.Attempt(), recovered: l.Recovered()}
							leases[c] = append(leases[c], held{l, in.key})
						default:
							out = linReceiptOut(rc)
						}
					case linCommit, linFail:
						var rc *receipts.Receipt
						var err error
						if in.op == linCommit {
							rc, err = lease.Commit(ctx, []byte(in.result))
						} else {
							rc, err = lease.Fail(ctx, []byte(in.result))
						}
						if err != nil {
							out = linErrOut(err)
						} else {
							out = linReceiptOut(rc)
						}
					case linRelease, linRenew:
						var err error
						if in.op == linRelease {
							err = lease.Release(ctx)
						} else {
							err = lease.Renew(ctx)
						}
						out = linOutput{kind: outOK}
						if err != nil {
							out = linErrOut(err)
						}
					case linLookup:
						rc, err := db.Lookup(ctx, k)
						if err != nil {
							out = linErrOut(err)
						} else {
							out = linReceiptOut(rc)
						}
					}
					ret := seq.Add(1)
					mu.Lock()
					ops = append(ops, porcupine.Operation{ClientId: c, Input: in, Call: call, Output: out, Return: ret})
					if out.kind == outLease {
						tokens = append(tokens, out.token)
					}
					mu.Unlock()
					if len(leases[c]) > 6 {
						leases[c] = leases[c][1:]
					}
				}
			}()
		}
		wg.Wait()
		// Move the clock between eras: not at all, half a lease, exactly
		// one lease (the boundary: expired), two, past retention (records
		// written in the era before are tombstones), or past the window.
		steps := []time.Duration{0, linTTL / 2, linTTL, 2 * linTTL, linRetention, linRetention + linWindow}
		clock.Add(int64(steps[eraRNG.IntN(len(steps))]))
	}
	return ops, tokens
}

func TestLinearizability(t *testing.T) {
	n := linHistories()
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("RECEIPTS_LIN_SEED"); s != "" {
		_, err := fmt.Sscan(s, &seed)
		require.NoError(t, err)
		n = 1
	}
	var checkTime time.Duration
	outcomes := map[string]int{}
	for h := 0; h < n; h++ {
		hs := seed + uint64(h)
		ops, tokens := linHistory(t, hs)
		require.Len(t, ops, linClients*linOpsPerClient)
		seen := map[uint64]bool{}
		for _, tok := range tokens {
			require.False(t, seen[tok], "history seed %d: token %d granted twice", hs, tok)
			seen[tok] = true
		}
		for _, op := range ops {
			o := op.Output.(linOutput)
			require.NotEqual(t, outError, o.kind, "history seed %d: unexpected error: %s", hs, o.err)
			name := linOpNames[op.Input.(linInput).op] + ":" + linOutNames[o.kind]
			if o.recovered {
				name += "(takeover)"
			}
			outcomes[name]++
		}
		start := time.Now()
		res, info := porcupine.CheckOperationsVerbose(linModel, ops, 30*time.Second)
		checkTime += time.Since(start)
		if res != porcupine.Ok {
			path := filepath.Join(t.TempDir(), "history.html")
			if os.Getenv("RECEIPTS_LIN_OUT") != "" {
				path = os.Getenv("RECEIPTS_LIN_OUT")
			}
			if err := porcupine.VisualizePath(linModel, info, path); err == nil {
				t.Logf("visualization: %s", path)
			}
			t.Fatalf("history %d (RECEIPTS_LIN_SEED=%d): porcupine says %s (Unknown counts as failure)", h, hs, res)
		}
	}
	t.Logf("%d histories of %d clients x %d operations linearizable (seed %d, checking took %s)", n, linClients, linOpsPerClient, seed, checkTime.Round(time.Millisecond))
	t.Logf("outcomes: %v", outcomes)
}
