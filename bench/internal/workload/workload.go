package workload

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Scopes is how many callers (tenants) the keys are spread over.
const Scopes = 8

// ResultSize is the size of the stored result of every operation: a small JSON-ish
// response, what an API call or a tool call typically returns.
const ResultSize = 128

// Key names one operation. It mirrors receipts.Key without importing the engine, so the
// floor and the peers build on their own.
type Key struct{ Scope, ID string }

// NewKey returns a key that no earlier call of run has produced: worker w's seq-th first call.
func NewKey(run string, w int, seq uint64) Key {
	return Key{
		Scope: "tenant-" + strconv.Itoa(w%Scopes),
		ID:    run + "-" + strconv.Itoa(w) + "-" + strconv.FormatUint(seq, 10),
	}
}

// FixedKey returns the i-th key of a fixed set (used for replays and hot keys).
func FixedKey(set string, i int) Key {
	return Key{Scope: "tenant-" + strconv.Itoa(i%Scopes), ID: set + "-" + strconv.Itoa(i)}
}

// Fingerprint is the intent digest of k: 32 bytes (SHA-256), as encoding.Fingerprint makes.
func Fingerprint(k Key) []byte {
	h := sha256.New()
	h.Write([]byte(k.Scope))
	h.Write([]byte{0})
	h.Write([]byte(k.ID))
	return h.Sum(nil)
}

// ResultFor returns the stored result for k: ResultSize bytes.
func ResultFor(k Key) []byte {
	b := make([]byte, ResultSize)
	n := copy(b, `{"status":"ok","id":"`+k.ID+`","amount":1234,"currency":"eur","pad":"`)
	for i := n; i < len(b)-2; i++ {
		b[i] = 'x'
	}
	copy(b[len(b)-2:], `"}`)
	return b
}

// Effect returns a small application write for CommitWith-style benchmarks: a key and a
// 64-byte value (an "order row").
func Effect(k Key) (key, value []byte) {
	key = append([]byte("app/order/"), k.Scope...)
	key = append(key, '/')
	key = append(key, k.ID...)
	value = make([]byte, 64)
	binary.BigEndian.PutUint64(value, uint64(len(k.ID)))
	return key, value
}

// RunID returns a short string unique to this process and call, to keep keys of
// different runs over the same store apart.
func RunID() string {
	return strconv.FormatInt(time.Now().UnixNano()%1e12, 36) + "-" + strconv.FormatUint(runSeq.Add(1), 36)
}

var runSeq atomic.Uint64

// Op is one operation of worker w; seq counts the worker's operations from 0.
type Op func(ctx context.Context, w int, seq uint64) error

// Result is what Run measured.
type Result struct {
	Ops     uint64
	Errors  uint64
	Elapsed time.Duration
	Hist    Hist
	// FirstErr is the first error an operation returned (the run stops at it).
	FirstErr error
}

// OpsPerSec is the throughput of the run.
func (r *Result) OpsPerSec() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Ops) / r.Elapsed.Seconds()
}

// Run calls op from conc goroutines until d has passed (or, when maxOps > 0, until maxOps
// operations have been issued), timing each call.
func Run(ctx context.Context, conc int, d time.Duration, maxOps uint64, op Op) *Result {
	if conc < 1 {
		conc = 1
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		issued   atomic.Uint64
		stop     atomic.Bool
		wg       sync.WaitGroup
		mu       sync.Mutex
		res      = &Result{}
		deadline = time.Now().Add(d)
	)
	hists := make([]Hist, conc)
	start := time.Now()
	for w := range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			h := &hists[w]
			var seq uint64
			for !stop.Load() {
				if maxOps > 0 && issued.Add(1) > maxOps {
					return
				}
				t0 := time.Now()
				err := op(ctx, w, seq)
				t1 := time.Now()
				seq++
				if err != nil {
					mu.Lock()
					res.Errors++
					if res.FirstErr == nil {
						res.FirstErr = fmt.Errorf("worker %d op %d: %w", w, seq-1, err)
					}
					mu.Unlock()
					stop.Store(true)
					cancel()
					return
				}
				h.Record(t1.Sub(t0))
				if d > 0 && t1.After(deadline) {
					stop.Store(true)
				}
			}
		}()
	}
	wg.Wait()
	res.Elapsed = time.Since(start)
	for i := range hists {
		res.Hist.Merge(&hists[i])
	}
	res.Ops = res.Hist.Count()
	return res
}

// UUIDKey returns the i-th key of a large set, with a 36-character UUID-shaped ID, the
// shape most clients mint for operation keys.
func UUIDKey(i uint64) Key {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], i)
	h := sha256.Sum256(b[:])
	const hexdig = "0123456789abcdef"
	id := make([]byte, 0, 36)
	for j, c := range h[:16] {
		if j == 4 || j == 6 || j == 8 || j == 10 {
			id = append(id, '-')
		}
		id = append(id, hexdig[c>>4], hexdig[c&15])
	}
	return Key{Scope: "tenant-" + strconv.FormatUint(i%Scopes, 10), ID: string(id)}
}
