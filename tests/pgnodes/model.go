package pgnodes

import (
	"fmt"
	"math"
	"sort"
	"strings"

	"github.com/anishathalye/porcupine"
)

// The porcupine model of one key, as the cross-node history sees it. It does not model time
// (the nodes' clocks and the database's are not the history's), so it cannot say when a lease
// ran out; it says what no clock can excuse:
//   - grants of a key get ever-larger tokens, and none comes after the key is finished;
//   - a commit finishes the key only if its token is the key's newest grant (fencing), and at
//     most one commit finishes it (claim atomicity);
//   - every read of a finished key returns that receipt; a pending read shows a token no older
//     than the newest grant; "not found" and "in progress" are only possible while unfinished.
//
// A commit whose outcome is unknown (its reply was lost, or its node was killed before it
// logged one) may or may not have happened: the model is nondeterministic there. A commit told
// "lease lost" changes nothing (a grant the history never saw may have fenced it).

type linKind uint8

const (
	linGrant linKind = iota + 1
	linCommit
	linRead
)

type linOutKind uint8

const (
	outOK linOutKind = iota + 1
	outLost
	outUnknown
	outReceipt // view: the receipt read (Pending included)
	outInProgress
	outNotFound
)

type linIn struct {
	kind linKind
	key  string
	op   string
	view receiptView // grant: token, attempt; commit: what it would record
}

type linOut struct {
	kind linOutKind
	view receiptView
}

type linState struct {
	done     bool
	view     receiptView
	maxToken uint64
}

func linStep(st, in, out any) []any {
	s, i, o := st.(linState), in.(linIn), out.(linOut)
	switch i.kind {
	case linGrant:
		if s.done || i.view.token <= s.maxToken {
			return nil
		}
		s.maxToken = i.view.token
		return []any{s}
	case linCommit:
		can := !s.done && i.view.token == s.maxToken
		next := linState{done: true, view: i.view, maxToken: s.maxToken}
		switch o.kind {
		case outOK:
			if can {
				return []any{next}
			}
			return nil
		case outLost:
			return []any{s}
		case outUnknown:
			if can {
				return []any{s, next}
			}
			return []any{s}
		}
		return nil
	case linRead:
		switch o.kind {
		case outReceipt:
			if o.view.state == "P" {
				if s.done || o.view.token < s.maxToken {
					return nil
				}
				s.maxToken = o.view.token
				return []any{s}
			}
			if s.done && o.view == s.view {
				return []any{s}
			}
			return nil
		case outInProgress, outNotFound:
			if s.done {
				return nil
			}
			return []any{s}
		}
	}
	return nil
}

var linKindNames = map[linKind]string{linGrant: "grant", linCommit: "commit", linRead: "read"}
var linOutNames = map[linOutKind]string{outOK: "ok", outLost: "lease-lost", outUnknown: "unknown", outReceipt: "receipt", outInProgress: "in-progress", outNotFound: "not-found"}

func describeOp(in, out any) string {
	i, o := in.(linIn), out.(linOut)
	s := fmt.Sprintf("%s %s", linKindNames[i.kind], i.op)
	switch i.kind {
	case linGrant:
		s += fmt.Sprintf(" [tok=%d att=%d]", i.view.token, i.view.attempt)
	case linCommit:
		s += fmt.Sprintf(" [%v]", i.view)
	}
	s += " -> " + linOutNames[o.kind]
	if o.kind == outReceipt {
		s += fmt.Sprintf(" [%v]", o.view)
	}
	return s
}

func partitionByKey(history []porcupine.Operation) [][]porcupine.Operation {
	byKey := map[string][]porcupine.Operation{}
	for _, op := range history {
		k := op.Input.(linIn).key
		byKey[k] = append(byKey[k], op)
	}
	keys := make([]string, 0, len(byKey))
	for k := range byKey {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	out := make([][]porcupine.Operation, 0, len(byKey))
	for _, k := range keys {
		out = append(out, byKey[k])
	}
	return out
}

var linModel = porcupine.NondeterministicModel{
	Partition:         partitionByKey,
	Init:              func() []any { return []any{linState{}} },
	Step:              linStep,
	DescribeOperation: describeOp,
	DescribeState: func(st any) string {
		s := st.(linState)
		if !s.done {
			return fmt.Sprintf("unfinished, newest grant tok=%d", s.maxToken)
		}
		return fmt.Sprintf("finished %v", s.view)
	},
}

// linOps turns the run's events into porcupine operations.
func linOps(grants, fnEnds, outcomes map[string]Event, evs []Event, rep *Report) []porcupine.Operation {
	var ops []porcupine.Operation
	add := func(in linIn, out linOut, call, ret int64) {
		if ret <= call {
			ret = call + 1
		}
		ops = append(ops, porcupine.Operation{ClientId: len(ops), Input: in, Output: out, Call: call, Return: ret})
	}
	for _, g := range sortedEvents(grants) {
		add(linIn{kind: linGrant, key: g.Key, op: g.Op, view: receiptView{token: g.Token, attempt: g.Attempt}}, linOut{kind: outOK}, g.Call, g.Ret)
		f, ok := fnEnds[g.Op]
		if !ok || (f.What != "commit" && f.What != "fail") {
			continue
		}
		want := receiptView{state: "S", result: f.Result, token: g.Token, attempt: g.Attempt}
		if f.What == "fail" {
			want.state = "F"
		}
		in := linIn{kind: linCommit, key: g.Key, op: g.Op, view: want}
		o, ok := outcomes[g.Op]
		if !ok {
			// No outcome was logged (its node was killed first). The commit may still take
			// effect after the kill: PostgreSQL runs a statement it has received even when
			// the client is gone (and the TCP proxy may still be forwarding it), so the
			// commit is in flight forever, not only until its node's end.
			add(in, linOut{kind: outUnknown}, f.Ret, math.MaxInt64)
			continue
		}
		out := linOut{kind: outUnknown}
		switch {
		case o.Kind == KindAck:
			if viewOf(o) != want {
				rep.bad("op %s on %s committed %v but was told %v", g.Op, g.Key, want, viewOf(o))
			}
			out.kind = outOK
		case o.What == "leaselost":
			out.kind = outLost
		}
		add(in, out, f.Ret, o.Ret)
	}
	for _, ev := range evs {
		if _, granted := grants[ev.Op]; granted {
			continue
		}
		in := linIn{kind: linRead, key: ev.Key, op: ev.Op}
		switch {
		case ev.Kind == KindAck || ev.Kind == KindReplay || (ev.Kind == KindFinal && ev.State != ""):
			add(in, linOut{kind: outReceipt, view: viewOf(ev)}, ev.Call, ev.Ret)
		case ev.Kind == KindFinal, ev.Kind == KindErr && ev.What == "notfound":
			add(in, linOut{kind: outNotFound}, ev.Call, ev.Ret)
		case ev.Kind == KindErr && ev.What == "inprogress":
			add(in, linOut{kind: outInProgress}, ev.Call, ev.Ret)
		}
	}
	return ops
}

// describeIllegal names the keys whose histories are not linearizable, with their operations.
func describeIllegal(ops []porcupine.Operation) string {
	m := linModel.ToModel()
	var b strings.Builder
	for _, part := range partitionByKey(ops) {
		if porcupine.CheckOperations(m, part) {
			continue
		}
		sort.Slice(part, func(i, j int) bool { return part[i].Call < part[j].Call })
		fmt.Fprintf(&b, "\n    key %s (%d ops):", part[0].Input.(linIn).key, len(part))
		t0 := part[0].Call
		for i, op := range part {
			if i == 60 {
				fmt.Fprintf(&b, "\n      ...")
				break
			}
			ret := "∞"
			if op.Return != math.MaxInt64 {
				ret = fmt.Sprintf("%.3fs", float64(op.Return-t0)/1e9)
			}
			fmt.Fprintf(&b, "\n      [%.3fs, %s] %s", float64(op.Call-t0)/1e9, ret, describeOp(op.Input, op.Output))
		}
	}
	return b.String()
}
