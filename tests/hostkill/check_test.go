package hostkill_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/receiptstore/receipts/intents"
)

// report is what analyze counts.
type report struct {
	actions, logged                       int // in the journal; approvals the host logged
	succeeded, failed, uncertain, other   int
	effects, requests                     int
	duplicates, lost, twoKeys, unfinished int
	problems                              []string
}

func (r *report) bad() bool { return len(r.problems) > 0 }

func (r *report) String() string {
	return fmt.Sprintf("%d approvals in the journal (%d logged by the host): %d succeeded, %d failed, %d uncertain, %d other; "+
		"service: %d effects, %d requests; duplicate effects %d, approvals lost %d, actions under two keys %d, unfinished %d, other problems %d",
		r.actions, r.logged, r.succeeded, r.failed, r.uncertain, r.other, r.effects, r.requests,
		r.duplicates, r.lost, r.twoKeys, r.unfinished, len(r.problems)-r.duplicates-r.lost-r.twoKeys-r.unfinished)
}

func (r *report) problem(format string, args ...any) {
	r.problems = append(r.problems, fmt.Sprintf(format, args...))
}

// analyze counts the run from the service's logs and the host's journal.
func analyze(ctx context.Context, c config) (*report, error) {
	r := &report{}
	j, closePool, err := openJournal(ctx, c)
	if err != nil {
		return nil, err
	}
	defer closePool()
	defer j.Close()
	byIntent := map[string]*intents.Action{}
	for a, err := range j.List(ctx, 0) {
		if err != nil {
			return nil, err
		}
		var args chargeArgs
		if err := json.Unmarshal(a.Arguments, &args); err != nil {
			return nil, fmt.Errorf("action %s: %w", a.Key, err)
		}
		if prev := byIntent[args.Intent]; prev != nil {
			r.twoKeys++
			r.problem("intent %s approved twice: %s and %s", args.Intent, prev.Key, a.Key)
		}
		byIntent[args.Intent] = a
		r.actions++
		switch a.State {
		case intents.Succeeded:
			r.succeeded++
		case intents.Failed:
			r.failed++
		case intents.Uncertain:
			r.uncertain++
		case intents.Approved:
			r.unfinished++
			r.problem("action %s (%s) still approved", a.Key, args.Intent)
		default:
			r.other++
		}
	}

	approvals, err := readLog(c.Dir, approvalsLog)
	if err != nil {
		return nil, err
	}
	r.logged = len(approvals)
	for _, l := range approvals {
		intent, key := l[0], l[1]
		a := byIntent[intent]
		if a == nil || a.Key != key {
			r.lost++
			r.problem("approval of %s (key %s) lost: journal has %v", intent, key, a)
		}
	}

	requests, err := readLog(c.Dir, requestsLog)
	if err != nil {
		return nil, err
	}
	r.requests = len(requests)
	keysOf := map[string]map[string]bool{}
	for _, l := range requests {
		if len(l) != 2 {
			r.problem("request without intent or key: %q", l)
			continue
		}
		intent, key := l[0], l[1]
		if keysOf[intent] == nil {
			keysOf[intent] = map[string]bool{}
		}
		keysOf[intent][key] = true
	}
	for intent, keys := range keysOf {
		a := byIntent[intent]
		switch {
		case a == nil:
			r.problem("the service got %s, which the journal does not have", intent)
		case len(keys) > 1 || !keys[a.Key]:
			r.twoKeys++
			r.problem("%s arrived under keys %v; its key is %s", intent, keys, a.Key)
		}
	}

	effects, err := readLog(c.Dir, effectsLog)
	if err != nil {
		return nil, err
	}
	r.effects = len(effects)
	effectsOf := map[string][]string{} // intent → effect ids
	for _, l := range effects {
		effectsOf[l[0]] = append(effectsOf[l[0]], l[2])
		if a := byIntent[l[0]]; a != nil && a.Key != l[1] {
			r.problem("effect of %s under key %s; its key is %s", l[0], l[1], a.Key)
		}
	}
	for intent, ids := range effectsOf {
		if len(ids) > 1 {
			r.duplicates += len(ids) - 1
			r.problem("duplicate effects of %s: %v", intent, ids)
		}
		if byIntent[intent] == nil {
			r.problem("effect of %s, which the journal does not have", intent)
		}
	}
	for intent, a := range byIntent {
		n := len(effectsOf[intent])
		switch kind := intent[strings.LastIndexByte(intent, '.')+1:]; {
		case a.State == intents.Succeeded:
			if kind != kindOK || n != 1 {
				r.problem("%s succeeded with %d effects", intent, n)
				continue
			}
			if id := effectID(c.Wire, a.Answer.Body); id != effectsOf[intent][0] {
				r.problem("%s: the answer names effect %q, the service performed %q", intent, id, effectsOf[intent][0])
			}
		case a.State == intents.Failed:
			if kind != kindBad || n != 0 {
				r.problem("%s failed (%s) with %d effects", intent, a.Answer.Body, n)
			}
		case a.State == intents.Uncertain:
			if kind != kindDown || n != 0 {
				r.problem("%s uncertain (%s) with %d effects", intent, a.LastError, n)
			}
		case a.State != intents.Approved:
			r.problem("%s ended %v", intent, a.State)
		}
	}
	return r, nil
}

// effectID reads the effect a success answer names.
func effectID(wire string, body []byte) string {
	var res chargeResult
	if wire == "mcp" {
		var tr struct {
			StructuredContent chargeResult `json:"structuredContent"`
		}
		_ = json.Unmarshal(body, &tr)
		res = tr.StructuredContent
	} else {
		_ = json.Unmarshal(body, &res)
	}
	return res.Effect
}
