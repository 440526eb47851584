package pgnodes

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"
)

// Report is what Check found.
type Report struct {
	Violations []string // empty: every invariant held

	Effects, Grants, Acks, Finished, Takeovers, Adoptions, Keys int
	Conflicts, LeaseLost, Errors                                int
	PorcupineOps                                                int
	PorcupineTime                                               time.Duration
}

func (r *Report) bad(format string, args ...any) {
	if len(r.Violations) < 200 {
		r.Violations = append(r.Violations, fmt.Sprintf(format, args...))
	}
}

// OK reports whether no invariant was violated.
func (r *Report) OK() bool { return len(r.Violations) == 0 }

// String summarises the report.
func (r *Report) String() string {
	s := fmt.Sprintf("%d keys, %d grants (%d takeovers), %d effects (%d adopted by a recovered attempt), %d acks, %d finished keys, %d conflicts, %d lease-lost, %d other errors; porcupine %d ops in %v",
		r.Keys, r.Grants, r.Takeovers, r.Effects, r.Adoptions, r.Acks, r.Finished, r.Conflicts, r.LeaseLost, r.Errors, r.PorcupineOps, r.PorcupineTime.Round(time.Millisecond))
	if len(r.Violations) > 0 {
		s += fmt.Sprintf("\n%d violations:\n  %s", len(r.Violations), strings.Join(r.Violations, "\n  "))
	}
	return s
}

type receiptView struct {
	state, result string
	token         uint64
	attempt       uint32
}

func viewOf(ev Event) receiptView {
	return receiptView{ev.State, ev.Result, ev.Token, ev.Attempt}
}

func (v receiptView) String() string {
	if v.state == "" {
		return "absent"
	}
	return fmt.Sprintf("%s %q tok=%d att=%d", v.state, v.result, v.token, v.attempt)
}

// Check checks a run: its events (every log of the run directory, see ReadRun). A commit whose
// node was killed before it logged an outcome is taken to be in flight forever: PostgreSQL may
// run it after the kill. verifiers names the incarnations whose final views must all agree (at
// least one).
func Check(evs []Event, verifiers []string) *Report {
	rep := &Report{}
	grants := map[string]Event{} // op -> grant
	fnEnds := map[string]Event{}
	outcomes := map[string]Event{}  // op -> its ack or error outcome
	effects := map[string][]Event{} // key -> effects
	finals := map[string]map[string]receiptView{}
	for _, v := range verifiers {
		finals[v] = map[string]receiptView{}
	}
	var acks []Event
	for _, ev := range evs {
		switch ev.Kind {
		case KindGrant:
			if _, dup := grants[ev.Op]; dup {
				rep.bad("op %s granted twice", ev.Op)
			}
			grants[ev.Op] = ev
			rep.Grants++
			if ev.Recovered {
				rep.Takeovers++
			}
		case KindFnEnd:
			fnEnds[ev.Op] = ev
		case KindAck, KindErr:
			outcomes[ev.Op] = ev
			if ev.Kind == KindAck {
				acks = append(acks, ev)
				rep.Acks++
				break
			}
			switch ev.What {
			case "inprogress":
				rep.Conflicts++
			case "leaselost":
				rep.LeaseLost++
			case "none":
				rep.bad("op %s on %s: the store returned neither a lease, a receipt nor an error", ev.Op, ev.Key)
			case "error":
				rep.Errors++
			}
		case KindEffect:
			effects[ev.Key] = append(effects[ev.Key], ev)
			rep.Effects++
		case KindFinal:
			if m, ok := finals[ev.Inc]; ok {
				m[ev.Key] = viewOf(ev)
			}
		case KindReplay:
			if m, ok := finals[ev.Inc]; ok {
				if v := viewOf(ev); v != m[ev.Key] {
					rep.bad("final replay of %s on %s: %v, its Lookup: %v", ev.Key, ev.Inc, v, m[ev.Key])
				}
			}
		case KindProblem:
			rep.bad("%s on %s: %s", ev.Key, ev.Inc, ev.What)
		}
	}
	keys := Keys(evs)
	rep.Keys = len(keys)

	// 0 duplicate effects.
	effectOps := map[string]map[string]bool{} // key -> ops that made an effect on it
	for key, es := range effects {
		effectOps[key] = map[string]bool{}
		for _, e := range es {
			effectOps[key][e.Op] = true
		}
		if len(es) > 1 {
			var who []string
			for _, e := range es {
				who = append(who, fmt.Sprintf("%s (tok=%d att=%d recovered=%v)", e.Op, e.Token, e.Attempt, e.Recovered))
			}
			rep.bad("duplicate effect on %s: %d effects, by %s", key, len(es), strings.Join(who, ", "))
		}
	}
	namesEffect := func(key, result string) bool {
		op, ok := strings.CutPrefix(result, "eff:")
		if !ok {
			op, ok = strings.CutPrefix(result, "adopt:")
		}
		return ok && effectOps[key][op]
	}
	for _, ev := range grants {
		if f, ok := fnEnds[ev.Op]; ok && strings.HasPrefix(f.Result, "adopt:") {
			rep.Adoptions++
		}
	}

	// No token handed out twice: a token names one key, one attempt and (among grants and
	// effects) one operation.
	type owner struct {
		key     string
		attempt uint32
		op      string
	}
	byToken := map[uint64]owner{}
	claimToken := func(tok uint64, o owner, what string) {
		if tok == 0 {
			rep.bad("%s on %s: token 0", what, o.key)
			return
		}
		prev, ok := byToken[tok]
		switch {
		case !ok:
			byToken[tok] = o
		case prev.key != o.key || prev.attempt != o.attempt || (prev.op != "" && o.op != "" && prev.op != o.op):
			rep.bad("token %d handed out twice: %s att=%d op=%s, and %s (%s att=%d op=%s)", tok, prev.key, prev.attempt, prev.op, what, o.key, o.attempt, o.op)
		case prev.op == "":
			byToken[tok] = o
		}
	}
	for _, g := range sortedEvents(grants) {
		claimToken(g.Token, owner{g.Key, g.Attempt, g.Op}, "grant "+g.Op)
	}
	for _, key := range keys {
		for _, e := range effects[key] {
			claimToken(e.Token, owner{e.Key, e.Attempt, e.Op}, "effect "+e.Op)
		}
	}
	for _, a := range acks {
		claimToken(a.Token, owner{a.Key, a.Attempt, ""}, "receipt told to "+a.Op)
	}

	// 0 lost acknowledged receipts: what a worker was told is what every node reads at the
	// end, and every finished receipt names the key's effect.
	if len(verifiers) == 0 {
		rep.bad("no final view to check acknowledged receipts against")
	}
	for _, a := range acks {
		if a.State != "S" && a.State != "F" {
			continue
		}
		if !namesEffect(a.Key, a.Result) {
			rep.bad("receipt %v of %s told to %s names no effect of the key", viewOf(a), a.Key, a.Op)
		}
		for _, v := range verifiers {
			if got := finals[v][a.Key]; got != viewOf(a) {
				rep.bad("lost acknowledged receipt: %s was told %v on %s (%s), %s reads %v at the end", a.Op, viewOf(a), a.Key, a.What, v, got)
			}
		}
	}
	for _, key := range keys {
		var first receiptView
		for i, v := range verifiers {
			got := finals[v][key]
			if i == 0 {
				first = got
			} else if got != first {
				rep.bad("nodes disagree at the end on %s: %s reads %v, %s reads %v", key, verifiers[0], first, v, got)
			}
		}
		if first.state == "S" || first.state == "F" {
			rep.Finished++
			if !namesEffect(key, first.result) {
				rep.bad("final receipt of %s, %v, names no effect of the key", key, first)
			}
		} else if len(effects[key]) > 0 && len(verifiers) > 0 {
			rep.bad("effect without receipt: %s had an effect (%s) but ends %v", key, effects[key][0].Op, first)
		}
	}

	// Linearizability of the cross-node history, per key.
	ops := linOps(grants, fnEnds, outcomes, evs, rep)
	rep.PorcupineOps = len(ops)
	start := time.Now()
	res, _ := porcupine.CheckOperationsVerbose(linModel.ToModel(), ops, 5*time.Minute)
	rep.PorcupineTime = time.Since(start)
	switch res {
	case porcupine.Ok:
	case porcupine.Illegal:
		rep.bad("history not linearizable: %s", describeIllegal(ops))
	default:
		rep.bad("porcupine: %s", res)
	}
	return rep
}

func sortedEvents(m map[string]Event) []Event {
	out := make([]Event, 0, len(m))
	for _, ev := range m {
		out = append(out, ev)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Op < out[j].Op })
	return out
}
