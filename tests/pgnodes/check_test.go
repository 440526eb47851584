package pgnodes

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// hist builds small histories for the checker's own tests. Times are in "ticks".
type hist struct{ evs []Event }

func (h *hist) grant(op, key string, tok uint64, att uint32, rec bool, call, ret int64) {
	h.evs = append(h.evs, Event{Kind: KindGrant, Inc: "n0g0", Op: op, Key: key, Token: tok, Attempt: att, Recovered: rec, PK: "pk-" + key, Call: call, Ret: ret})
}

func (h *hist) effect(op, key string, tok uint64, att uint32, at int64) {
	h.evs = append(h.evs, Event{Kind: KindEffect, Inc: "n0g0", Op: op, Key: key, Token: tok, Attempt: att, PK: "pk-" + key, Call: at, Ret: at})
}

func (h *hist) fnEnd(op, key, what, result string, tok uint64, att uint32, at int64) {
	h.evs = append(h.evs, Event{Kind: KindFnEnd, Inc: "n0g0", Op: op, Key: key, What: what, Result: result, Token: tok, Attempt: att, Ret: at})
}

func (h *hist) ack(op, key, state, result string, tok uint64, att uint32, call, ret int64) {
	h.evs = append(h.evs, Event{Kind: KindAck, Inc: "n0g0", Op: op, Key: key, What: "do", State: state, Result: result, Token: tok, Attempt: att, Call: call, Ret: ret})
}

func (h *hist) fail(op, key, what string, call, ret int64) {
	h.evs = append(h.evs, Event{Kind: KindErr, Inc: "n0g0", Op: op, Key: key, What: what, Call: call, Ret: ret})
}

func (h *hist) final(v, key, state, result string, tok uint64, att uint32, at int64) {
	h.evs = append(h.evs, Event{Kind: KindFinal, Inc: v, Op: v + key, Key: key, State: state, Result: result, Token: tok, Attempt: att, Call: at, Ret: at + 1})
}

// good is a clean history: k1 done at once and replayed; k2's first attempt makes the effect
// and dies (abandon), the second is Recovered and adopts the effect; k3 is claimed, released,
// claimed again and committed; a conflict and a lookup.
func good() *hist {
	h := &hist{}
	h.grant("a", "k1", 5, 1, false, 10, 20)
	h.effect("a", "k1", 5, 1, 25)
	h.fnEnd("a", "k1", "commit", "eff:a", 5, 1, 30)
	h.ack("a", "k1", "S", "eff:a", 5, 1, 10, 40)
	h.ack("b", "k1", "S", "eff:a", 5, 1, 15, 60) // waited for a, then replayed

	h.grant("c", "k2", 7, 1, false, 100, 110)
	h.effect("c", "k2", 7, 1, 115)
	h.fnEnd("c", "k2", "abandon", "eff:c", 7, 1, 120)
	h.fail("c", "k2", "abandoned", 100, 130)
	h.fail("e", "k2", "inprogress", 112, 113)
	h.grant("d", "k2", 9, 2, true, 140, 150)
	h.fnEnd("d", "k2", "commit", "adopt:c", 9, 2, 160)
	h.ack("d", "k2", "S", "adopt:c", 9, 2, 140, 170)

	h.grant("f", "k3", 11, 1, false, 200, 210)
	h.fnEnd("f", "k3", "release", "", 11, 1, 215)
	h.fail("f", "k3", "notperformed", 200, 220)
	h.grant("g", "k3", 12, 1, false, 230, 240)
	h.effect("g", "k3", 12, 1, 245)
	h.fnEnd("g", "k3", "fail", "eff:g", 12, 1, 250)
	h.ack("g", "k3", "F", "eff:g", 12, 1, 230, 260)
	h.evs = append(h.evs, Event{Kind: KindAck, Inc: "n0g0", Op: "h", Key: "k3", What: "lookup", State: "F", Result: "eff:g", Token: 12, Attempt: 1, Call: 270, Ret: 280})

	for _, v := range []string{"v0", "v1"} {
		h.final(v, "k1", "S", "eff:a", 5, 1, 1000)
		h.final(v, "k2", "S", "adopt:c", 9, 2, 1000)
		h.final(v, "k3", "F", "eff:g", 12, 1, 1000)
	}
	return h
}

func mustFail(t *testing.T, h *hist, want ...string) {
	t.Helper()
	rep := Check(h.evs, []string{"v0", "v1"})
	if rep.OK() {
		t.Fatalf("the checker passed a bad history: %s", rep)
	}
	all := strings.Join(rep.Violations, "\n")
	for _, w := range want {
		if !strings.Contains(all, w) {
			t.Errorf("violations do not mention %q:\n%s", w, all)
		}
	}
}

func TestCheckGoodHistory(t *testing.T) {
	rep := Check(good().evs, []string{"v0", "v1"})
	if !rep.OK() {
		t.Fatalf("a good history failed: %s", rep)
	}
	if rep.Effects != 3 || rep.Grants != 5 || rep.Takeovers != 1 || rep.Adoptions != 1 || rep.Finished != 3 || rep.Conflicts != 1 {
		t.Fatalf("counts: %s", rep)
	}
}

// A second effect on a key (the recovered attempt did not reconcile, or two holders ran).
func TestCheckDuplicateEffect(t *testing.T) {
	h := good()
	h.effect("d", "k2", 9, 2, 155)
	mustFail(t, h, "duplicate effect on k2")
}

// A receipt a worker was told about is not what the nodes read at the end.
func TestCheckLostAck(t *testing.T) {
	h := good()
	for i, ev := range h.evs {
		if ev.Kind == KindFinal && ev.Key == "k1" && ev.Inc == "v1" {
			h.evs[i].State, h.evs[i].Result, h.evs[i].Token, h.evs[i].Attempt = "", "", 0, 0
		}
	}
	mustFail(t, h, "lost acknowledged receipt", "v1 reads absent")
}

// One token handed to two grants (of different keys).
func TestCheckReusedToken(t *testing.T) {
	h := good()
	for i, ev := range h.evs {
		if ev.Op == "g" && (ev.Kind == KindGrant || ev.Kind == KindEffect || ev.Kind == KindFnEnd || ev.Kind == KindAck) {
			h.evs[i].Token = 5
		}
		if ev.Kind == KindFinal && ev.Key == "k3" || ev.Op == "h" {
			h.evs[i].Token = 5
		}
	}
	mustFail(t, h, "token 5 handed out twice")
}

// Fencing removed: a holder whose key was taken over (a newer grant) still commits.
func TestCheckStaleCommit(t *testing.T) {
	h := good()
	h.grant("s", "k4", 20, 1, false, 300, 310)
	h.effect("s", "k4", 20, 1, 311)
	h.grant("t", "k4", 21, 2, true, 320, 400) // took over after s's lease ran out
	h.fnEnd("s", "k4", "commit", "eff:s", 20, 1, 410)
	h.ack("s", "k4", "S", "eff:s", 20, 1, 300, 420) // the stale commit succeeded
	h.fnEnd("t", "k4", "commit", "adopt:s", 21, 2, 430)
	h.fail("t", "k4", "leaselost", 320, 440)
	for _, v := range []string{"v0", "v1"} {
		h.final(v, "k4", "S", "eff:s", 20, 1, 1000)
	}
	mustFail(t, h, "history not linearizable", "key k4")
}

// Claim atomicity removed: two first attempts of one key both commit.
func TestCheckTwoWinners(t *testing.T) {
	h := good()
	h.grant("u", "k5", 30, 1, false, 500, 510)
	h.grant("w", "k5", 31, 1, false, 500, 511)
	h.effect("u", "k5", 30, 1, 512)
	h.effect("w", "k5", 31, 1, 513)
	h.fnEnd("u", "k5", "commit", "eff:u", 30, 1, 520)
	h.fnEnd("w", "k5", "commit", "eff:w", 31, 1, 521)
	h.ack("u", "k5", "S", "eff:u", 30, 1, 500, 530)
	h.ack("w", "k5", "S", "eff:w", 31, 1, 500, 531)
	for _, v := range []string{"v0", "v1"} {
		h.final(v, "k5", "S", "eff:w", 31, 1, 1000)
	}
	mustFail(t, h, "duplicate effect on k5", "lost acknowledged receipt: u", "history not linearizable")
}

// An effect whose key ends with no receipt, and nodes that disagree at the end.
func TestCheckEffectWithoutReceiptAndDisagreement(t *testing.T) {
	h := good()
	h.grant("x", "k6", 40, 1, false, 600, 610)
	h.effect("x", "k6", 40, 1, 611)
	h.final("v0", "k6", "P", "", 40, 1, 1000)
	h.final("v1", "k6", "", "", 0, 0, 1000)
	mustFail(t, h, "effect without receipt: k6", "nodes disagree at the end on k6")
}

// An operation of a killed node whose commit may have happened: it is in flight forever (the
// server may run it after the kill), so a receipt it committed is accepted, even one that a
// read after the kill did not yet see, and so is none.
func TestCheckKilledCommit(t *testing.T) {
	for _, committed := range []bool{true, false} {
		h := good()
		h.grant("y", "k7", 50, 1, false, 700, 710)
		h.effect("y", "k7", 50, 1, 711)
		h.fnEnd("y", "k7", "commit", "eff:y", 50, 1, 712)
		// node n0g0 killed at 715, before y logged its outcome; the server ran the commit
		// later: a wait at 720 still found the key in progress
		h.fail("z", "k7", "inprogress", 720, 721)
		for _, v := range []string{"v0", "v1"} {
			if committed {
				h.final(v, "k7", "S", "eff:y", 50, 1, 1000)
			} else {
				h.final(v, "k7", "P", "", 50, 1, 1000)
			}
		}
		rep := Check(h.evs, []string{"v0", "v1"})
		if committed && !rep.OK() {
			t.Fatalf("committed: %s", rep)
		}
		if !committed && (rep.OK() || !strings.Contains(strings.Join(rep.Violations, "\n"), "effect without receipt: k7")) {
			t.Fatalf("not committed: want only 'effect without receipt', got %s", rep)
		}
	}
}

// The log format survives a round trip, and a torn last line (a writer killed mid-write) is
// ignored while a torn line in the middle is an error.
func TestLogRoundTrip(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "hist-x.log")
	l, err := OpenLog(path)
	if err != nil {
		t.Fatal(err)
	}
	evs := good().evs
	for _, ev := range evs {
		if err := l.Append(ev, false); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = f.WriteString("A n0g0 z k1 do S")
	f.Close()
	got, err := ReadLog(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(evs) {
		t.Fatalf("read %d events, wrote %d", len(got), len(evs))
	}
	for i := range got {
		if got[i] != evs[i] {
			t.Fatalf("event %d: read %+v, wrote %+v", i, got[i], evs[i])
		}
	}
	f, _ = os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	_, _ = f.WriteString("\n" + string(evs[0].line()))
	f.Close()
	if _, err := ReadLog(path); err == nil {
		t.Fatal("a torn line in the middle was accepted")
	}
}

// The provider answers by idempotency key across processes' appends, including lines appended
// after its previous answer, and waits for a line still being written.
func TestProviderFind(t *testing.T) {
	dir := t.TempDir()
	a, err := OpenProvider(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := OpenProvider(dir) // another process's view of the same log
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if _, found, err := b.Find("pk1"); err != nil || found {
		t.Fatalf("empty log: %v %v", found, err)
	}
	if err := a.Perform(Event{Op: "x", Key: "k1", PK: "pk1", Token: 3, Attempt: 1}); err != nil {
		t.Fatal(err)
	}
	if err := a.Perform(Event{Op: "y", Key: "k1", PK: "pk1", Token: 4, Attempt: 2}); err != nil {
		t.Fatal(err)
	}
	if ev, found, err := b.Find("pk1"); err != nil || !found || ev.Op != "x" {
		t.Fatalf("after two effects: %+v %v %v, want the first (x)", ev, found, err)
	}
	f, err := os.OpenFile(filepath.Join(dir, providerLog), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	line := Event{Kind: KindEffect, Op: "z", Key: "k2", PK: "pk2"}.line()
	_, _ = f.Write(line[:10]) // a writer in the middle of its line
	if _, found, err := b.Find("pk2"); err != nil || found {
		t.Fatalf("half a line: %v %v", found, err)
	}
	_, _ = f.Write(line[10:])
	f.Close()
	if ev, found, err := b.Find("pk2"); err != nil || !found || ev.Op != "z" {
		t.Fatalf("after the line completed: %+v %v %v", ev, found, err)
	}
}
