package machine

import (
	"math"
	"testing"

	"github.com/receiptstore/receipts/encoding"
)

// ttl (30) is machine_test.go's.

func claimed(t *testing.T, cur *encoding.Record, now int64, tok uint64) ClaimResult {
	t.Helper()
	res, err := Claim(cur, []byte("fp"), now, ttl, func() (uint64, error) { return tok, nil })
	if err != nil || res.Outcome != Claimed {
		t.Fatalf("claim at %d: %+v, %v", now, res, err)
	}
	return res
}

// TestReleaseRecoveredKeepsClaim: releasing a first attempt deletes the
// record; releasing a takeover keeps it as an abandoned claim (pending,
// lease ended now, same fingerprint, attempts kept), which the next claim
// takes over at once, Recovered, with one more attempt. Forget deletes.
func TestReleaseRecoveredKeepsClaim(t *testing.T) {
	first := claimed(t, nil, 100, 1)
	if next, ok := Release(first.Next, 1, 110); !ok || next != nil {
		t.Fatalf("release of a first attempt: %+v, %v; want delete", next, ok)
	}

	took := claimed(t, first.Next, 200, 2) // first's lease ran out at 130
	if !took.Recovered || took.Next.Attempts != 2 {
		t.Fatalf("takeover: %+v", took)
	}
	if _, ok := Release(took.Next, 1, 210); ok {
		t.Fatal("a stale token released the key")
	}
	kept, ok := Release(took.Next, 2, 210)
	if !ok || kept == nil {
		t.Fatalf("release of a Recovered lease: %+v, %v; want the claim kept", kept, ok)
	}
	if kept.State != encoding.StatePending || kept.Attempts != 2 || kept.Token != 2 ||
		string(kept.Fingerprint) != "fp" || kept.LeaseExpiresAt != 210 || kept.UpdatedAt != 210 {
		t.Fatalf("kept claim: %+v", kept)
	}
	again := claimed(t, kept, 210, 3) // at once: the lease ended at 210
	if !again.Recovered || again.Next.Attempts != 3 {
		t.Fatalf("claim after releasing a Recovered lease: %+v", again)
	}

	if Forget(again.Next, 2) {
		t.Fatal("a stale token forgot the key")
	}
	if !Forget(again.Next, 3) {
		t.Fatal("forget by the holder refused")
	}
	if r := claimed(t, nil, 220, 4); r.Recovered || r.Next.Attempts != 1 {
		t.Fatalf("after Forget: %+v", r)
	}
}

// TestExpiredSaturates: a last write so late that adding the retention
// overflows never expires (it used to wrap negative: expired at once).
func TestExpiredSaturates(t *testing.T) {
	if Expired(math.MaxInt64-10, math.MaxInt64-5, 100) {
		t.Fatal("overflowing expiry read as expired")
	}
	if !Expired(0, 100, 100) || Expired(1, 100, 100) {
		t.Fatal("expiry boundary")
	}
}
