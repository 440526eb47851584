package fuzz

// FuzzAPI drives the public API of a real store (Pebble on vfs.NewMem, fake
// clock) with a program decoded from the fuzzer's bytes: random scopes, IDs
// (empty, 255 and 256 bytes, any bytes), fingerprints (nil, empty, 1024 and
// 1025 bytes), results (nil, over MaxResultSize) and call orders. It checks:
//   - no panic (other than the re-raised panic of Do's fn);
//   - bad input gets an error wrapping ErrInvalidArgument and changes
//     nothing in the engine (byte for byte);
//   - valid input never gets an unexpected error;
//   - a replay equals the commit, a committed key never hands out a lease
//     and rejects another intent, until its retention ends;
//   - fencing tokens strictly increase; Scan of a scope returns only it.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/pebblestore"
)

const (
	retention = time.Hour
	leaseTTL  = time.Minute
)

// prog reads the fuzzer's bytes; past the end it reads zeros.
type prog struct{ b []byte }

func (p *prog) byte() byte {
	if len(p.b) == 0 {
		return 0
	}
	c := p.b[0]
	p.b = p.b[1:]
	return c
}

func (p *prog) take(n int) []byte {
	n = min(n, len(p.b))
	out := p.b[:n:n]
	p.b = p.b[n:]
	return out
}

func (p *prog) part() string {
	switch c := p.byte(); c % 8 {
	case 0:
		return ""
	case 1:
		return strings.Repeat("x", receipts.MaxKeyPartLen)
	case 2:
		return strings.Repeat("y", receipts.MaxKeyPartLen+1)
	case 3:
		return string([]byte{c}) // one raw byte: NUL, 0xff, '/', ...
	default:
		return string(p.take(int(p.byte()%12) + 1))
	}
}

func (p *prog) fingerprint() []byte {
	switch p.byte() % 7 {
	case 0:
		return nil
	case 1:
		return []byte{}
	case 2:
		return bytes.Repeat([]byte{1}, receipts.MaxFingerprintLen+1)
	case 3:
		return bytes.Repeat([]byte{2}, receipts.MaxFingerprintLen)
	case 4, 5:
		return []byte("fp") // the same intent, often
	default:
		return p.take(int(p.byte()%8) + 1)
	}
}

func (p *prog) result() []byte {
	switch p.byte() % 8 {
	case 0:
		return nil
	case 1:
		return make([]byte, receipts.MaxResultSize+1)
	default:
		return p.take(int(p.byte() % 16))
	}
}

func validKey(k receipts.Key) bool {
	return len(k.Scope) > 0 && len(k.Scope) <= receipts.MaxKeyPartLen && len(k.ID) > 0 && len(k.ID) <= receipts.MaxKeyPartLen
}

func validFP(fp []byte) bool { return len(fp) > 0 && len(fp) <= receipts.MaxFingerprintLen }

func validResult(r []byte) bool { return len(r) <= receipts.MaxResultSize }

type done struct {
	fp     []byte
	state  receipts.State
	result []byte
	at     time.Time // last write
}

type held struct {
	l   *receipts.Lease
	key receipts.Key
}

type harness struct {
	t        *testing.T
	db       *receipts.DB
	now      time.Time
	keys     []receipts.Key
	leases   []held
	done     map[receipts.Key]done // committed receipts still in retention
	maxToken uint64
}

// snapshot is every key and value in the engine.
func (h *harness) snapshot() string {
	it, err := pebblestore.DB(h.db).NewIter(nil)
	if err != nil {
		h.t.Fatal(err)
	}
	defer it.Close()
	var sb strings.Builder
	for ok := it.First(); ok; ok = it.Next() {
		fmt.Fprintf(&sb, "%q=%q\n", it.Key(), it.Value())
	}
	return sb.String()
}

// bad checks an error for bad input: ErrInvalidArgument, nothing written.
func (h *harness) bad(what string, before string, err error) {
	h.t.Helper()
	if !errors.Is(err, receipts.ErrInvalidArgument) {
		h.t.Fatalf("%s with bad input: got %v, want ErrInvalidArgument", what, err)
	}
	if after := h.snapshot(); after != before {
		h.t.Fatalf("%s with bad input changed the store", what)
	}
}

// expected reports errors a valid call may get.
func expected(err error) bool {
	var ipe *receipts.InProgressError
	return err == nil || errors.As(err, &ipe) || errors.Is(err, receipts.ErrIntentMismatch) ||
		errors.Is(err, receipts.ErrLeaseLost) || errors.Is(err, receipts.ErrNotFound)
}

func (h *harness) live(k receipts.Key) (done, bool) {
	d, ok := h.done[k]
	if ok && !h.now.Before(d.at.Add(retention)) {
		delete(h.done, k)
		return done{}, false
	}
	return d, ok
}

func (h *harness) lease(k receipts.Key, l *receipts.Lease) {
	if l.Token() <= h.maxToken {
		h.t.Fatalf("token %d after %d: tokens must strictly increase", l.Token(), h.maxToken)
	}
	h.maxToken = l.Token()
	if d, ok := h.live(k); ok {
		h.t.Fatalf("%s: a lease for a key committed as %s", k, d.state)
	}
	h.leases = append(h.leases, held{l, k})
	if len(h.leases) > 8 {
		h.leases = h.leases[1:]
	}
}

// receipt checks a returned receipt of k against what was committed, and
// records a new commit.
func (h *harness) receipt(what string, k receipts.Key, fp []byte, r *receipts.Receipt, fresh bool) {
	if r == nil {
		h.t.Fatalf("%s %s: nil receipt", what, k)
	}
	if r.Key != k {
		h.t.Fatalf("%s %s: receipt of %s", what, k, r.Key)
	}
	if r.State == receipts.Pending {
		if fresh || what != "lookup" {
			h.t.Fatalf("%s %s: pending receipt", what, k)
		}
		return
	}
	if d, ok := h.live(k); ok && !fresh {
		if !bytes.Equal(d.fp, r.Fingerprint) || d.state != r.State || !bytes.Equal(d.result, r.Result) {
			h.t.Fatalf("%s %s: replay %s %q (fp %q), committed %s %q (fp %q)", what, k, r.State, r.Result, r.Fingerprint, d.state, d.result, d.fp)
		}
		return
	}
	if !fresh {
		h.t.Fatalf("%s %s: replay of a receipt that was never committed (or is past retention): %+v", what, k, r)
	}
	if fp != nil && !bytes.Equal(fp, r.Fingerprint) {
		h.t.Fatalf("%s %s: receipt with fingerprint %q, asked %q", what, k, r.Fingerprint, fp)
	}
	h.done[k] = done{fp: bytes.Clone(r.Fingerprint), state: r.State, result: bytes.Clone(r.Result), at: r.UpdatedAt}
}

func (h *harness) pickKey(p *prog) receipts.Key {
	if len(h.keys) > 0 && p.byte()%4 != 0 {
		return h.keys[int(p.byte())%len(h.keys)]
	}
	k := receipts.Key{Scope: p.part(), ID: p.part()}
	if validKey(k) && len(h.keys) < 6 {
		h.keys = append(h.keys, k)
	}
	return k
}

func (h *harness) pickLease(p *prog) (held, bool) {
	if len(h.leases) == 0 {
		return held{}, false
	}
	return h.leases[int(p.byte())%len(h.leases)], true
}

var errFn = errors.New("fn failed")

func (h *harness) step(p *prog) {
	ctx := context.Background()
	t := h.t
	switch p.byte() % 12 {
	case 0, 1: // Claim
		k, fp := h.pickKey(p), p.fingerprint()
		before := h.snapshot()
		l, r, err := h.db.Claim(ctx, k, fp)
		if !validKey(k) || !validFP(fp) {
			h.bad("Claim", before, err)
			return
		}
		if !expected(err) {
			t.Fatalf("Claim %s: %v", k, err)
		}
		if d, ok := h.live(k); ok && !bytes.Equal(d.fp, fp) && !errors.Is(err, receipts.ErrIntentMismatch) {
			t.Fatalf("Claim %s with another intent: %v, want ErrIntentMismatch", k, err)
		}
		switch {
		case err != nil:
		case l != nil && r != nil, l == nil && r == nil:
			t.Fatalf("Claim %s: lease %v, receipt %v", k, l, r)
		case l != nil:
			h.lease(k, l)
		default:
			h.receipt("claim", k, fp, r, false)
		}
	case 2, 3, 4: // Commit, Fail, CommitWith
		hl, ok := h.pickLease(p)
		if !ok {
			return
		}
		res := p.result()
		op := p.byte() % 3
		effectErr := p.byte()%4 == 0
		before := h.snapshot()
		var r *receipts.Receipt
		var err error
		switch op {
		case 0:
			r, err = hl.l.Commit(ctx, res)
		case 1:
			r, err = hl.l.Fail(ctx, res)
		default:
			r, err = pebblestore.CommitWith(ctx, hl.l, res, func(b *pebble.Batch) error {
				if err := b.Set([]byte(fmt.Sprintf("app/%d", hl.l.Token())), res, nil); err != nil {
					return err
				}
				if effectErr {
					return errFn
				}
				return nil
			})
		}
		if !validResult(res) {
			h.bad("Commit", before, err)
			return
		}
		if op == 2 && effectErr && errors.Is(err, errFn) {
			if h.snapshot() != before {
				t.Fatalf("CommitWith whose effect failed changed the store")
			}
			return
		}
		if !expected(err) {
			t.Fatalf("Commit %s: %v", hl.key, err)
		}
		if err == nil {
			if !bytes.Equal(r.Result, res) {
				t.Fatalf("Commit %s: result %q, committed %q", hl.key, r.Result, res)
			}
			h.receipt("commit", hl.key, nil, r, true)
		}
	case 5: // Release
		if hl, ok := h.pickLease(p); ok {
			if err := hl.l.Release(ctx); !expected(err) {
				t.Fatalf("Release %s: %v", hl.key, err)
			}
		}
	case 6: // Renew
		if hl, ok := h.pickLease(p); ok {
			if err := hl.l.Renew(ctx); !expected(err) {
				t.Fatalf("Renew %s: %v", hl.key, err)
			}
		}
	case 7: // Lookup
		k := h.pickKey(p)
		before := h.snapshot()
		r, err := h.db.Lookup(ctx, k)
		if !validKey(k) {
			h.bad("Lookup", before, err)
			return
		}
		if !expected(err) {
			t.Fatalf("Lookup %s: %v", k, err)
		}
		if _, ok := h.live(k); ok && err != nil {
			t.Fatalf("Lookup of committed %s: %v", k, err)
		}
		if err == nil {
			h.receipt("lookup", k, nil, r, false)
		}
	case 8: // Scan
		f := receipts.Filter{Scope: h.pickKey(p).Scope, State: receipts.State(p.byte() % 5), Limit: int(int8(p.byte()))}
		valid := len(f.Scope) <= receipts.MaxKeyPartLen && f.State <= receipts.Failed && f.Limit >= 0
		before := h.snapshot()
		n := 0
		for r, err := range h.db.Scan(ctx, f) {
			if !valid {
				h.bad("Scan", before, err)
				return
			}
			if err != nil {
				t.Fatalf("Scan %+v: %v", f, err)
			}
			if f.Scope != "" && r.Key.Scope != f.Scope {
				t.Fatalf("Scan of scope %q returned %s", f.Scope, r.Key)
			}
			if f.State != 0 && r.State != f.State {
				t.Fatalf("Scan of state %s returned %s", f.State, r.State)
			}
			n++
		}
		if f.Limit > 0 && n > f.Limit {
			t.Fatalf("Scan with limit %d returned %d", f.Limit, n)
		}
	case 9: // Do
		k, fp := h.pickKey(p), p.fingerprint()
		res, outcome := p.result(), p.byte()%5
		dctx := ctx
		if validKey(k) {
			if r, err := h.db.Lookup(ctx, k); err == nil && r.State == receipts.Pending && h.now.Before(r.LeaseExpiresAt) {
				var cancel context.CancelFunc // Do would wait for the holder
				dctx, cancel = context.WithTimeout(ctx, time.Millisecond)
				defer cancel()
			}
		}
		before := h.snapshot()
		called := false
		var r *receipts.Receipt
		var err error
		panicked := func() (panicked bool) {
			defer func() {
				if v := recover(); v != nil {
					if v != "fn panicked" {
						panic(v)
					}
					panicked = true
				}
			}()
			r, err = h.db.Do(dctx, k, fp, func(_ context.Context, l *receipts.Lease) ([]byte, error) {
				called = true
				h.lease(k, l)
				switch outcome {
				case 1:
					return nil, receipts.NotPerformed(errFn)
				case 2:
					return res, receipts.Permanent(errFn)
				case 3:
					return nil, errFn
				case 4:
					panic("fn panicked")
				}
				return res, nil
			})
			return false
		}()
		if !validKey(k) || !validFP(fp) {
			h.bad("Do", before, err)
			if called {
				t.Fatalf("Do ran fn for bad input")
			}
			return
		}
		if d, ok := h.live(k); ok && called {
			t.Fatalf("Do ran fn for %s, committed as %s", k, d.state)
		}
		if panicked {
			if !called || outcome != 4 {
				t.Fatalf("Do panicked without fn panicking")
			}
			return
		}
		switch {
		case called && outcome == 0 && validResult(res):
			if err != nil {
				t.Fatalf("Do %s: %v", k, err)
			}
			h.receipt("do", k, fp, r, true)
		case called && outcome == 2 && validResult(res):
			if !errors.Is(err, receipts.ErrFailed) || !errors.Is(err, errFn) {
				t.Fatalf("Do %s, permanent failure: %v", k, err)
			}
			h.receipt("do", k, fp, r, true)
		case called:
			if err == nil {
				t.Fatalf("Do %s: fn failed (%d) or its result was too large, but no error", k, outcome)
			}
		case err == nil || errors.Is(err, receipts.ErrFailed) && r != nil:
			h.receipt("do", k, fp, r, false)
		case !expected(err) && !errors.Is(err, context.DeadlineExceeded):
			t.Fatalf("Do %s: %v", k, err)
		}
	case 10: // the clock
		switch p.byte() % 3 {
		case 0:
			h.now = h.now.Add(time.Second)
		case 1:
			h.now = h.now.Add(leaseTTL)
		default:
			h.now = h.now.Add(retention)
		}
	case 11:
		if _, err := h.db.GC(ctx); err != nil {
			t.Fatalf("GC: %v", err)
		}
	}
}

func FuzzAPI(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte("\x00\x04\x05ab\x05\x04cd\x04\x02\x00\x07\x01\x00"))
	f.Add([]byte("\x09\x04\x05ab\x05\x04cd\x04\x02\x00\x07\x00\x00\x09\x05\x00\x04\x00\x07\x00\x00\x00"))
	f.Add([]byte("\x00\x00\x01\x02\x04\x00\x00\x00\x00\x0a\x01\x00\x01\x00\x04\x07\x00"))
	f.Add([]byte("\x09\x00\x00\x00\x04\x00\x00\x04\x09\x00\x00\x04\x05\x09\x00\x00\x06\x03zzz\x07\x02\x00\x08\x00\x00\x00"))
	f.Add(bytes.Repeat([]byte{0, 1, 3, 2, 4, 4, 3, 0, 7, 0, 5, 0}, 8))
	f.Fuzz(fuzzAPI)
}

// fuzzAPI runs one program on a fresh store.
func fuzzAPI(t *testing.T, b []byte) {
	if len(b) > 4096 {
		return
	}
	h := &harness{t: t, now: time.Date(2026, 10, 7, 12, 0, 0, 0, time.UTC), done: map[receipts.Key]done{}}
	db, err := pebblestore.Open("db", &pebblestore.Options{
		Options: receipts.Options{
			Retention:  retention,
			LeaseTTL:   leaseTTL,
			GCInterval: -1,
			Now:        func() time.Time { return h.now },
		},
		Pebble: &pebble.Options{FS: vfs.NewMem()},
	})
	if err != nil {
		t.Fatal(err)
	}
	h.db = db
	defer func() {
		if err := db.Close(); err != nil {
			t.Fatal(err)
		}
	}()
	p := &prog{b: b}
	// Go's fuzzing has no per-input timeout: a call that blocks for
	// good (a waiter never woken) crashes the worker with every stack.
	wd := time.AfterFunc(time.Minute, func() {
		buf := make([]byte, 1<<20)
		n := runtime.Stack(buf, true)
		panic(fmt.Sprintf("input %q ran for a minute; goroutines:\n%s", b, buf[:n]))
	})
	defer wd.Stop()
	for i := 0; len(p.b) > 0 && i < 200; i++ {
		h.step(p)
	}
}
