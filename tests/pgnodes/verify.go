package pgnodes

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sort"
	"sync"

	"github.com/receiptstore/receipts"
)

// Keys returns every key the events name, sorted.
func Keys(evs []Event) []string {
	seen := map[string]bool{}
	var out []string
	for _, ev := range evs {
		if ev.Key != "" && !seen[ev.Key] {
			seen[ev.Key] = true
			out = append(out, ev.Key)
		}
	}
	sort.Strings(out)
	return out
}

// Settle lets every key left Pending by a dead or fenced-out holder be taken over and
// reconciled with the provider (adopting the effect it finds, releasing otherwise), as the next
// caller of a real service would. Its operations go to hist-settle.log, like a node's.
func Settle(ctx context.Context, db *receipts.DB, dir string, keys []string) error {
	n := &Node{DB: db, Inc: "settle", Dir: dir}
	var err error
	if n.hist, err = OpenLog(filepath.Join(dir, histPrefix+n.Inc+".log")); err != nil {
		return err
	}
	defer n.hist.Close()
	if n.provider, err = OpenProvider(dir); err != nil {
		return err
	}
	defer n.provider.Close()
	sem := make(chan struct{}, 16)
	var wg sync.WaitGroup
	for i, key := range keys {
		k := receipts.Key{Scope: Scope, ID: key}
		r, err := db.Lookup(ctx, k)
		if errors.Is(err, receipts.ErrNotFound) || (err == nil && r.State != receipts.Pending) {
			continue
		}
		if err != nil {
			return fmt.Errorf("pgnodes: settle: lookup %s: %w", key, err)
		}
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			id := fmt.Sprintf("settle-o%d", i)
			call := now()
			r, err := db.Do(ctx, k, Fingerprint, func(ctx context.Context, l *receipts.Lease) ([]byte, error) {
				n.grant(id, call, l)
				var res []byte
				ferr := receipts.NotPerformed(errNothing)
				if l.Recovered() {
					ev, found, err := n.provider.Find(l.ProviderKey())
					if err != nil {
						n.fail(err)
						return nil, err
					}
					if found {
						res, ferr = []byte("adopt:"+ev.Op), nil
					}
				}
				n.fnEnd(id, l, res, ferr)
				return res, ferr
			})
			n.outcome(id, key, "do", call, r, err)
		}()
	}
	wg.Wait()
	if p := n.failed.Load(); p != nil {
		return *p
	}
	return nil
}

// Verify writes one node's final view of keys to final-<inc>.log: a Lookup of each key, and
// for each finished one a Do that must replay it without calling fn.
func Verify(ctx context.Context, db *receipts.DB, dir, inc string, keys []string) error {
	l, err := OpenLog(filepath.Join(dir, finalPrefix+inc+".log"))
	if err != nil {
		return err
	}
	defer l.Close()
	for _, key := range keys {
		k := receipts.Key{Scope: Scope, ID: key}
		call := now()
		r, err := db.Lookup(ctx, k)
		ev := Event{Kind: KindFinal, Inc: inc, Op: inc + "-" + key, Key: key, Call: call}
		switch {
		case errors.Is(err, receipts.ErrNotFound):
		case err != nil:
			return fmt.Errorf("pgnodes: verify: lookup %s: %w", key, err)
		default:
			ev.State, ev.Result, ev.Token, ev.Attempt = stateName(r.State), string(r.Result), r.Token, r.Attempts
		}
		ev.Ret = now()
		if err := l.Append(ev, false); err != nil {
			return err
		}
		if r == nil || r.State == receipts.Pending {
			continue
		}
		called := false
		call = now()
		d, _ := db.Do(ctx, k, Fingerprint, func(context.Context, *receipts.Lease) ([]byte, error) {
			called = true
			return nil, receipts.NotPerformed(errNothing)
		})
		ev = Event{Kind: KindReplay, Inc: inc, Op: inc + "-d-" + key, Key: key, Call: call, Ret: now()}
		switch {
		case called:
			ev.Kind, ev.What = KindProblem, "fn-called-on-finished-key"
		case d == nil:
			ev.Kind, ev.What = KindProblem, "replay-failed"
		default:
			ev.State, ev.Result, ev.Token, ev.Attempt = stateName(d.State), string(d.Result), d.Token, d.Attempts
		}
		if err := l.Append(ev, false); err != nil {
			return err
		}
	}
	return l.f.Sync()
}
