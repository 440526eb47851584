package receipts_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"
	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/pebblestore"
)

// TestDataDriven runs the state machine scripts in testdata/machine/*.txt
// with github.com/cockroachdb/datadriven. Each case is a command, a "----"
// line, and the expected output, ended by a blank line:
//
//	claim a k fp as=L1        claim (a, k) with fingerprint fp; name the lease L1
//	claim a k fp wait         with WaitForResult (bounded: 50ms)
//	commit L1 result          fail L1 result    release L1    renew L1    forget L1
//	lookup a k                do a k fp ok=result | do a k fp err=notperformed|permanent|unknown
//	advance 31s               back 10s (clock jumps backwards)
//	gc                        reopen                stats
//
// Each script gets a fresh store. Run with -rewrite to regenerate the
// expected output.
func TestDataDriven(t *testing.T) {
	files, err := filepath.Glob("testdata/machine/*.txt")
	if err != nil || len(files) == 0 {
		t.Fatalf("no scripts: %v", err)
	}
	datadriven.Walk(t, "testdata/machine", func(t *testing.T, path string) {
		sc := &script{t: t, leases: map[string]*receipts.Lease{}}
		sc.s = newTestStore(t, func(o *pebblestore.Options) {
			o.Retention = time.Hour
			o.LeaseTTL = 30 * time.Second
			o.EpochWidth = 15 * time.Minute
			o.TombstoneWindow = 2 * time.Hour
			o.LogKeys = true // the scripts read errors that name keys as "scope"/"id"
		})
		sc.start = sc.s.clock.Now()
		datadriven.RunTest(t, path, func(t *testing.T, td *datadriven.TestData) string {
			if td.Input != "" {
				td.Fatalf(t, "commands take no input")
			}
			sc.t = t
			// The commands are positional: run sees the line as written
			// (datadriven splits key=value arguments, FullCmd joins them).
			return sc.run(td.FullCmd()) + "\n"
		})
	})
}

type script struct {
	t      *testing.T
	s      *testStore
	leases map[string]*receipts.Lease
	start  time.Time
}

func errName(err error) string {
	for _, e := range []struct {
		err  error
		name string
	}{
		{receipts.ErrIntentMismatch, "intent mismatch"},
		{receipts.ErrLeaseLost, "lease lost"},
		{receipts.ErrExpired, "expired"}, // before ErrNotFound: Lookup of a tombstone matches both
		{receipts.ErrNotFound, "not found"},
		{receipts.ErrFailed, "failed"},
		{receipts.ErrInvalidFingerprint, "invalid fingerprint"},
		{receipts.ErrInvalidKey, "invalid key"},
		{receipts.ErrResultTooLarge, "result too large"},
		{receipts.ErrClosed, "closed"},
		{receipts.ErrCorrupt, "corrupt"},
	} {
		if errors.Is(err, e.err) {
			return "error: " + e.name
		}
	}
	var ip *receipts.InProgressError
	if errors.As(err, &ip) {
		return fmt.Sprintf("error: in progress (retry after %s)", ip.RetryAfter)
	}
	return "error: " + err.Error()
}

func (sc *script) receipt(r *receipts.Receipt) string {
	now := sc.s.clock.Now()
	s := fmt.Sprintf("%s %s/%s fp=%s attempts=%d token=%d", r.State, r.Key.Scope, r.Key.ID, r.Fingerprint, r.Attempts, r.Token)
	if r.State == receipts.Pending {
		if r.Abandoned(now) {
			s += " abandoned"
		} else {
			s += fmt.Sprintf(" lease=%s", r.LeaseExpiresAt.Sub(now))
		}
	} else {
		s += fmt.Sprintf(" result=%q", r.Result)
	}
	return s + fmt.Sprintf(" expires=%s", r.ExpiresAt.Sub(now))
}

func (sc *script) lease(l *receipts.Lease) string {
	return fmt.Sprintf("lease token=%d attempt=%d recovered=%t", l.Token(), l.Attempt(), l.Recovered())
}

func (sc *script) run(line string) string {
	f := strings.Fields(line)
	db := sc.s.db
	arg := func(i int) string {
		if i < len(f) {
			return f[i]
		}
		sc.t.Fatalf("%q: missing argument %d", line, i)
		return ""
	}
	opt := func(name string) (string, bool) {
		for _, a := range f[1:] {
			if v, ok := strings.CutPrefix(a, name+"="); ok {
				return v, true
			}
			if a == name {
				return "", true
			}
		}
		return "", false
	}
	switch f[0] {
	case "claim":
		var opts []receipts.ClaimOption
		ctx := context.Background()
		if _, ok := opt("wait"); ok {
			opts = append(opts, receipts.WaitForResult())
			c, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
			defer cancel()
			ctx = c
		}
		l, r, err := db.Claim(ctx, key(arg(1), arg(2)), []byte(arg(3)), opts...)
		switch {
		case err != nil:
			return errName(err)
		case r != nil:
			return sc.receipt(r)
		}
		if name, ok := opt("as"); ok {
			sc.leases[name] = l
		}
		return sc.lease(l)
	case "commit", "fail":
		l := sc.leases[arg(1)]
		fn := l.Commit
		if f[0] == "fail" {
			fn = l.Fail
		}
		r, err := fn(bg, []byte(arg(2)))
		if err != nil {
			return errName(err)
		}
		return sc.receipt(r)
	case "release":
		if err := sc.leases[arg(1)].Release(bg); err != nil {
			return errName(err)
		}
		return "ok"
	case "forget":
		if err := sc.leases[arg(1)].Forget(bg); err != nil {
			return errName(err)
		}
		return "ok"
	case "renew":
		if err := sc.leases[arg(1)].Renew(bg); err != nil {
			return errName(err)
		}
		return "ok"
	case "lookup":
		r, err := db.Lookup(bg, key(arg(1), arg(2)))
		if err != nil {
			return errName(err)
		}
		return sc.receipt(r)
	case "do":
		var called string
		r, err := db.Do(bg, key(arg(1), arg(2)), []byte(arg(3)), func(ctx context.Context, l *receipts.Lease) ([]byte, error) {
			called = "ran " + sc.lease(l) + "\n"
			if v, ok := opt("ok"); ok {
				return []byte(v), nil
			}
			v, _ := opt("err")
			switch v {
			case "notperformed":
				return nil, receipts.NotPerformed(errors.New("nothing happened"))
			case "permanent":
				return []byte("declined"), receipts.Permanent(errors.New("declined"))
			}
			return nil, errors.New("provider timed out")
		})
		out := called
		if r != nil {
			out += sc.receipt(r)
			if err != nil {
				out += "\n"
			}
		}
		if err != nil {
			out += errName(err)
		}
		return out
	case "advance", "back":
		d, err := time.ParseDuration(arg(1))
		if err != nil {
			sc.t.Fatal(err)
		}
		if f[0] == "back" {
			d = -d
		}
		sc.s.clock.Advance(d)
		return fmt.Sprintf("clock=+%s", sc.s.clock.Now().Sub(sc.start))
	case "gc":
		st, err := db.GC(bg)
		if err != nil {
			return errName(err)
		}
		out := fmt.Sprintf("dropped=%d writes=%d", st.EpochsDropped, st.Writes)
		if st.TombstoneEpochsDropped > 0 {
			out += fmt.Sprintf(" tombstone-epochs=%d", st.TombstoneEpochsDropped)
		}
		return out
	case "reopen":
		sc.s.reopen()
		return "ok"
	case "stats":
		st := countOf(sc.t, db)
		return fmt.Sprintf("epochs=%d pending=%d abandoned=%d succeeded=%d failed=%d expired=%d",
			st.LiveEpochs, st.Pending, st.Abandoned, st.Succeeded, st.Failed, st.Expired)
	}
	sc.t.Fatalf("unknown command %q", line)
	return ""
}
