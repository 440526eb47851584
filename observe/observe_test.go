package observe_test

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/receiptstore/receipts/observe"
)

// An Event names its key only by KeyHash: every fmt verb prints the hash and
// never the scope or ID; the hash is stable for a key and hash key, differs
// between hash keys and between keys, and is empty without a hash key (GC).
func TestEventHidesItsKey(t *testing.T) {
	hk := []byte("a hash key derived from a store's secret")
	e := observe.NewEvent(observe.ClaimEvent, hk, "tenant-secret-scope", "op-secret-id")
	e.Outcome = observe.OutcomeClaimed
	for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%q"} {
		out := fmt.Sprintf(verb, e)
		if strings.Contains(out, "secret") {
			t.Errorf("%s prints the key: %s", verb, out)
		}
		if !strings.Contains(out, e.KeyHash()) {
			t.Errorf("%s does not print the KeyHash: %s", verb, out)
		}
	}
	if !regexp.MustCompile(`^[0-9a-f]{24}$`).MatchString(e.KeyHash()) {
		t.Fatalf("KeyHash %q is not 24 hex digits", e.KeyHash())
	}
	same := observe.NewEvent(observe.FinishEvent, hk, "tenant-secret-scope", "op-secret-id")
	other := observe.NewEvent(observe.ClaimEvent, []byte("another store"), "tenant-secret-scope", "op-secret-id")
	otherKey := observe.NewEvent(observe.ClaimEvent, hk, "tenant-secret-scope", "op-secret-id2")
	switch {
	case same.KeyHash() != e.KeyHash():
		t.Error("one key, two hashes")
	case other.KeyHash() == e.KeyHash():
		t.Error("two stores give a key the same hash")
	case otherKey.KeyHash() == e.KeyHash():
		t.Error("two keys share a hash")
	}
	if gc := (observe.Event{Kind: observe.GCEvent}); gc.KeyHash() != "" {
		t.Errorf("a GC event's KeyHash is %q", gc.KeyHash())
	}
}

// Observers drops nil entries, returns the only one as itself, and hands
// every event to each of several in turn; KindFilter declines kinds.
func TestObservers(t *testing.T) {
	if observe.Observers(nil, nil) != nil {
		t.Fatal("Observers of nils is not nil")
	}
	var got []string
	a := observe.ObserverFunc(func(_ context.Context, e observe.Event) { got = append(got, "a:"+e.Kind.String()) })
	b := observe.ObserverFunc(func(_ context.Context, e observe.Event) { got = append(got, "b:"+e.Kind.String()) })
	if o := observe.Observers(nil, a); fmt.Sprintf("%p", o) != fmt.Sprintf("%p", a) {
		t.Error("one observer is not returned as itself")
	}
	o := observe.Observers(a, nil, b)
	o.Observe(context.Background(), observe.NewEvent(observe.DoEvent, nil, "s", "i"))
	if strings.Join(got, ",") != "a:do,b:do" {
		t.Errorf("events went to %v", got)
	}
	if !observe.Observes(o, observe.GCEvent) || observe.Observes(nil, observe.GCEvent) {
		t.Error("Observes")
	}
}

// tallier is a ReplayObserver that logs its calls.
type tallier struct {
	name string
	got  *[]string
}

func (r tallier) Observe(_ context.Context, e observe.Event) {
	*r.got = append(*r.got, r.name+":"+e.Kind.String())
}
func (r tallier) ObserveReplay(_ context.Context, e observe.Event) {
	*r.got = append(*r.got, r.name+":replay "+e.Kind.String())
}
func (r tallier) BeginAt(ctx context.Context, kind observe.EventKind, start time.Time) context.Context {
	*r.got = append(*r.got, r.name+":begin "+kind.String()+" "+start.Format("15:04"))
	return ctx
}

// Observers is a ReplayObserver when every observer it is given is one, and hands each
// call to each in turn; with one that is not, it is not one.
func TestObserversOfReplayObservers(t *testing.T) {
	var got []string
	a, b := tallier{"a", &got}, tallier{"b", &got}
	o, ok := observe.Observers(a, nil, b).(observe.ReplayObserver)
	if !ok {
		t.Fatal("Observers of ReplayObservers is not one")
	}
	o.ObserveReplay(context.Background(), observe.NewEvent(observe.ClaimEvent, nil, "s", "i"))
	o.BeginAt(context.Background(), observe.DoEvent, time.Date(2026, 1, 1, 12, 30, 0, 0, time.UTC))
	if want := "a:replay claim,b:replay claim,a:begin do 12:30,b:begin do 12:30"; strings.Join(got, ",") != want {
		t.Errorf("calls went %v, want %s", got, want)
	}
	plain := observe.ObserverFunc(func(context.Context, observe.Event) {})
	if _, ok := observe.Observers(a, plain).(observe.ReplayObserver); ok {
		t.Error("Observers with an Observer that is not a ReplayObserver is one")
	}
}
