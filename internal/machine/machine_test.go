package machine

import (
	"errors"
	"reflect"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/receiptstore/receipts/encoding"
)

// Times in the table: the lease TTL is 30, retention 100; records are
// written at 10 and their lease runs to 40 unless a case says otherwise.
const (
	ttl       = 30
	retention = 100
)

// pending is a record claimed at 10 by token 7, first attempt, lease to 40.
func pending() *encoding.Record {
	return &encoding.Record{State: encoding.StatePending, Fingerprint: []byte("fp"), Attempts: 1, Token: 7,
		CreatedAt: 10, UpdatedAt: 10, LeaseExpiresAt: 40}
}

func with(r *encoding.Record, f func(*encoding.Record)) *encoding.Record { f(r); return r }

func finished(state encoding.State) *encoding.Record {
	return with(pending(), func(r *encoding.Record) {
		r.State, r.Result, r.UpdatedAt, r.LeaseExpiresAt = state, []byte("res"), 20, 0
	})
}

// got is what a transition returned, in one comparable shape.
type got struct {
	Outcome    Outcome // Claim only
	OK         bool    // Renew, Finish, Abandon
	Next       *encoding.Record
	Recovered  bool
	RetryAfter int64
	Tokens     int // calls of Claim's token function
	Err        string
}

var errTokens = errors.New("token ceiling write failed")

func claim(fp string, now int64, tokenErr bool) func(*encoding.Record) got {
	return func(cur *encoding.Record) got {
		var g got
		res, err := Claim(cur, []byte(fp), now, ttl, func() (uint64, error) {
			g.Tokens++
			if tokenErr {
				return 0, errTokens
			}
			return 8, nil
		})
		if err != nil {
			g.Err = err.Error()
		}
		g.Outcome, g.Next, g.Recovered, g.RetryAfter = res.Outcome, res.Next, res.Recovered, res.RetryAfter
		return g
	}
}

func renew(token uint64, now int64) func(*encoding.Record) got {
	return func(cur *encoding.Record) got {
		next, ok := Renew(cur, token, now, ttl)
		return got{OK: ok, Next: next}
	}
}

func finish(token uint64, state encoding.State, result string, now int64) func(*encoding.Record) got {
	return func(cur *encoding.Record) got {
		next, ok := Finish(cur, token, state, []byte(result), now)
		return got{OK: ok, Next: next}
	}
}

func abandon(token uint64, now int64) func(*encoding.Record) got {
	return func(cur *encoding.Record) got {
		next, ok := Abandon(cur, token, now)
		return got{OK: ok, Next: next}
	}
}

// TestTransitions is every transition of the state machine except Release,
// one row per (state, request). To add a transition, add a constructor like
// claim or renew and its rows. Each row also checks that the transition
// leaves the current record as it was.
func TestTransitions(t *testing.T) {
	for _, tc := range []struct {
		name string
		cur  *encoding.Record
		do   func(*encoding.Record) got
		want got
	}{
		// Claim.
		{"claim absent", nil, claim("fp", 10, false), got{Outcome: Claimed, Tokens: 1, Next: claimedBy(8)}},
		{"claim absent, token fails", nil, claim("fp", 10, true), got{Tokens: 1, Err: errTokens.Error()}},
		{"claim live lease", pending(), claim("fp", 25, false), got{Outcome: InProgress, RetryAfter: 15}},
		{"claim live lease, last instant", pending(), claim("fp", 39, false), got{Outcome: InProgress, RetryAfter: 1}},
		{"claim lease ran out (at expiry)", pending(), claim("fp", 40, false), got{Outcome: Claimed, Recovered: true, Tokens: 1,
			Next: with(pending(), func(r *encoding.Record) { r.Token, r.Attempts, r.UpdatedAt, r.LeaseExpiresAt = 8, 2, 40, 70 })}},
		{"claim lease long gone", pending(), claim("fp", 90, false), got{Outcome: Claimed, Recovered: true, Tokens: 1,
			Next: with(pending(), func(r *encoding.Record) { r.Token, r.Attempts, r.UpdatedAt, r.LeaseExpiresAt = 8, 2, 90, 120 })}},
		{"claim abandoned", with(pending(), func(r *encoding.Record) { r.UpdatedAt, r.LeaseExpiresAt = 15, 15 }), claim("fp", 16, false),
			got{Outcome: Claimed, Recovered: true, Tokens: 1,
				Next: with(pending(), func(r *encoding.Record) { r.Token, r.Attempts, r.UpdatedAt, r.LeaseExpiresAt = 8, 2, 16, 46 })}},
		{"claim takeover, token fails", pending(), claim("fp", 40, true), got{Tokens: 1, Err: errTokens.Error()}},
		{"claim succeeded", finished(encoding.StateSucceeded), claim("fp", 30, false), got{Outcome: Replay}},
		{"claim failed", finished(encoding.StateFailed), claim("fp", 30, false), got{Outcome: Replay}},
		{"claim live lease, other fp", pending(), claim("other", 25, false), got{Outcome: Mismatch}},
		{"claim lease ran out, other fp", pending(), claim("other", 90, false), got{Outcome: Mismatch}},
		{"claim succeeded, other fp", finished(encoding.StateSucceeded), claim("other", 30, false), got{Outcome: Mismatch}},
		{"claim failed, other fp", finished(encoding.StateFailed), claim("other", 30, false), got{Outcome: Mismatch}},
		{"claim, fp prefix", pending(), claim("f", 25, false), got{Outcome: Mismatch}},

		// Renew: fencing is by token, not time.
		{"renew live", pending(), renew(7, 25), got{OK: true,
			Next: with(pending(), func(r *encoding.Record) { r.UpdatedAt, r.LeaseExpiresAt = 25, 55 })}},
		{"renew after the lease ran out, nobody took over", pending(), renew(7, 90), got{OK: true,
			Next: with(pending(), func(r *encoding.Record) { r.UpdatedAt, r.LeaseExpiresAt = 90, 120 })}},
		{"renew never shortens", with(pending(), func(r *encoding.Record) { r.LeaseExpiresAt = 100 }), renew(7, 25), got{OK: true,
			Next: with(pending(), func(r *encoding.Record) { r.UpdatedAt, r.LeaseExpiresAt = 25, 100 })}},
		{"renew stale token", pending(), renew(6, 25), got{}},
		{"renew newer token", pending(), renew(8, 25), got{}},
		{"renew absent", nil, renew(7, 25), got{}},
		{"renew succeeded", finished(encoding.StateSucceeded), renew(7, 25), got{}},
		{"renew failed", finished(encoding.StateFailed), renew(7, 25), got{}},

		// Finish.
		{"commit", pending(), finish(7, encoding.StateSucceeded, "ok", 30), got{OK: true,
			Next: with(pending(), func(r *encoding.Record) {
				r.State, r.Result, r.UpdatedAt, r.LeaseExpiresAt = encoding.StateSucceeded, []byte("ok"), 30, 0
			})}},
		{"fail", pending(), finish(7, encoding.StateFailed, "declined", 30), got{OK: true,
			Next: with(pending(), func(r *encoding.Record) {
				r.State, r.Result, r.UpdatedAt, r.LeaseExpiresAt = encoding.StateFailed, []byte("declined"), 30, 0
			})}},
		{"commit after the lease ran out, nobody took over", pending(), finish(7, encoding.StateSucceeded, "ok", 90), got{OK: true,
			Next: with(pending(), func(r *encoding.Record) {
				r.State, r.Result, r.UpdatedAt, r.LeaseExpiresAt = encoding.StateSucceeded, []byte("ok"), 90, 0
			})}},
		{"commit stale token", pending(), finish(6, encoding.StateSucceeded, "ok", 30), got{}},
		{"commit absent", nil, finish(7, encoding.StateSucceeded, "ok", 30), got{}},
		{"commit twice", finished(encoding.StateSucceeded), finish(7, encoding.StateSucceeded, "again", 30), got{}},
		{"fail after commit", finished(encoding.StateSucceeded), finish(7, encoding.StateFailed, "x", 30), got{}},

		// Abandon: the lease ends now, the claim stays.
		{"abandon", pending(), abandon(7, 25), got{OK: true,
			Next: with(pending(), func(r *encoding.Record) { r.UpdatedAt, r.LeaseExpiresAt = 25, 25 })}},
		{"abandon stale token", pending(), abandon(6, 25), got{}},
		{"abandon absent", nil, abandon(7, 25), got{}},
		{"abandon finished", finished(encoding.StateFailed), abandon(7, 25), got{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var before *encoding.Record
			if tc.cur != nil {
				c := *tc.cur
				before = &c
			}
			g := tc.do(tc.cur)
			if d := cmp.Diff(tc.want, g); d != "" {
				t.Errorf("-want +got:\n%s", d)
			}
			if d := cmp.Diff(before, tc.cur); d != "" {
				t.Errorf("the current record changed (-before +after):\n%s", d)
			}
		})
	}
}

// pending2 is the record a first claim at 10 writes with token tok.
func claimedBy(tok uint64) *encoding.Record {
	return with(pending(), func(r *encoding.Record) { r.Token = tok })
}

// TestClaimCopiesFingerprint: the record Claim returns does not alias the
// caller's fingerprint.
func TestClaimCopiesFingerprint(t *testing.T) {
	fp := []byte("fp")
	res, err := Claim(nil, fp, 10, ttl, func() (uint64, error) { return 1, nil })
	if err != nil {
		t.Fatal(err)
	}
	fp[0] = 'x'
	if string(res.Next.Fingerprint) != "fp" {
		t.Fatalf("Next.Fingerprint = %q, aliases the caller's slice", res.Next.Fingerprint)
	}
}

// TestLifecycle walks one key through claim, abandon, recovered takeover,
// a stale holder's attempts, commit and replay, feeding each transition's
// record to the next.
func TestLifecycle(t *testing.T) {
	tokens := uint64(0)
	next := func() (uint64, error) { tokens++; return tokens, nil }
	fp := []byte("fp")
	c, _ := Claim(nil, fp, 0, ttl, next)
	if c.Outcome != Claimed || c.Recovered || c.Next.Token != 1 {
		t.Fatalf("first claim: %+v", c)
	}
	cur := c.Next
	cur, ok := Abandon(cur, 1, 5)
	if !ok {
		t.Fatal("abandon")
	}
	c, _ = Claim(cur, fp, 6, ttl, next)
	if c.Outcome != Claimed || !c.Recovered || c.Next.Token != 2 || c.Next.Attempts != 2 || c.Next.CreatedAt != 0 {
		t.Fatalf("takeover: %+v %+v", c, c.Next)
	}
	cur = c.Next
	if _, ok := Renew(cur, 1, 7, ttl); ok {
		t.Fatal("the old holder renewed")
	}
	if _, ok := Finish(cur, 1, encoding.StateSucceeded, []byte("late"), 7); ok {
		t.Fatal("the old holder committed")
	}
	cur, ok = Finish(cur, 2, encoding.StateSucceeded, []byte("done"), 8)
	if !ok {
		t.Fatal("commit")
	}
	for _, now := range []int64{9, 8 + retention - 1} {
		if !Visible(cur, now, retention) {
			t.Fatalf("not visible at %d", now)
		}
		if c, _ := Claim(cur, fp, now, ttl, next); c.Outcome != Replay {
			t.Fatalf("retry at %d: %+v", now, c)
		}
	}
	if Visible(cur, 8+retention, retention) {
		t.Fatal("visible at updatedAt+retention")
	}
	if tokens != 2 {
		t.Fatalf("%d tokens drawn, want 2", tokens)
	}
}

// TestBoundaries: retention and lease ends are exclusive.
func TestBoundaries(t *testing.T) {
	for _, tc := range []struct {
		name      string
		got, want bool
	}{
		{"expired just before", Expired(10, 10+retention-1, retention), false},
		{"expired at updatedAt+retention", Expired(10, 10+retention, retention), true},
		{"expired long after", Expired(10, 10+10*retention, retention), true},
		{"visible nil", Visible(nil, 0, retention), false},
		{"visible before", Visible(pending(), 10+retention-1, retention), true},
		{"visible at the end", Visible(pending(), 10+retention, retention), false},
		{"lease live before expiry", LeaseLive(pending(), 39), true},
		{"lease live at expiry", LeaseLive(pending(), 40), false},
		{"lease live, finished", LeaseLive(finished(encoding.StateSucceeded), 15), false},
	} {
		if tc.got != tc.want {
			t.Errorf("%s: got %t, want %t", tc.name, tc.got, tc.want)
		}
	}
}

// TestIntoMatches: ClaimInto and FinishInto decide as Claim and Finish do,
// writing Next into the room they are given (a first claim's fingerprint
// is the caller's slice), and leave cur as it was.
func TestIntoMatches(t *testing.T) {
	tok := func() (uint64, error) { return 7, nil }
	fp := []byte("fp")
	abandoned := with(claimedBy(1), func(r *encoding.Record) { r.LeaseExpiresAt = 11 })
	for _, cur := range []*encoding.Record{nil, abandoned, claimedBy(1)} {
		var before encoding.Record
		if cur != nil {
			before = *cur
		}
		want, werr := Claim(cur, fp, 20, ttl, tok)
		var room encoding.Record
		got, err := ClaimInto(&room, cur, fp, 20, ttl, tok)
		if (err == nil) != (werr == nil) || got.Outcome != want.Outcome || got.Recovered != want.Recovered || got.RetryAfter != want.RetryAfter {
			t.Fatalf("cur %+v: ClaimInto %+v, %v; Claim %+v, %v", cur, got, err, want, werr)
		}
		if want.Next != nil && (got.Next != &room || !reflect.DeepEqual(*got.Next, *want.Next)) {
			t.Fatalf("cur %+v: ClaimInto's Next %+v (room: %v), Claim's %+v", cur, got.Next, got.Next == &room, want.Next)
		}
		if cur == nil && &room.Fingerprint[0] != &fp[0] {
			t.Fatalf("a first claim's fingerprint is a copy")
		}
		if cur != nil && !reflect.DeepEqual(*cur, before) {
			t.Fatalf("ClaimInto changed cur: %+v, was %+v", cur, before)
		}
	}
	for _, token := range []uint64{1, 2} {
		cur := claimedBy(1)
		want, wok := Finish(cur, token, encoding.StateSucceeded, []byte("r"), 30)
		var room encoding.Record
		got, ok := FinishInto(&room, cur, token, encoding.StateSucceeded, []byte("r"), 30)
		if ok != wok || (ok && (got != &room || !reflect.DeepEqual(*got, *want))) || !reflect.DeepEqual(cur, claimedBy(1)) {
			t.Fatalf("token %d: FinishInto %+v, %v; Finish %+v, %v", token, got, ok, want, wok)
		}
	}
}
