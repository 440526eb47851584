package detach

import (
	"context"
	"errors"
	"testing"
	"time"
)

type key struct{}

func TestLikeWithoutCancel(t *testing.T) {
	cause := errors.New("gone")
	parent, cancel := context.WithCancelCause(context.WithValue(context.Background(), key{}, "v"))
	parent, stop := context.WithTimeout(parent, time.Hour)
	defer stop()
	d := Context(parent)
	std := context.WithoutCancel(parent)
	cancel(cause)
	if parent.Err() == nil || context.Cause(parent) != cause {
		t.Fatalf("parent not cancelled: %v, %v", parent.Err(), context.Cause(parent))
	}
	for _, c := range []context.Context{d, std} {
		if c.Err() != nil || c.Done() != nil {
			t.Errorf("%v: Err %v, Done %v: want nil, nil", c, c.Err(), c.Done())
		}
		if dl, ok := c.Deadline(); ok || !dl.IsZero() {
			t.Errorf("%v: Deadline %v, %v", c, dl, ok)
		}
		if got := c.Value(key{}); got != "v" {
			t.Errorf("%v: Value %v, want v", c, got)
		}
		if got := context.Cause(c); got != nil {
			t.Errorf("%v: Cause %v, want nil", c, got)
		}
		// A context derived from it is cancelled on its own, not by the parent.
		child, cc := context.WithCancelCause(c)
		if child.Err() != nil {
			t.Errorf("%v: child cancelled with the parent", c)
		}
		own := errors.New("own")
		cc(own)
		if context.Cause(child) != own {
			t.Errorf("%v: child's cause %v", c, context.Cause(child))
		}
	}
}

func TestValueAllocs(t *testing.T) {
	d := Context(context.WithValue(context.Background(), key{}, "v"))
	if n := testing.AllocsPerRun(100, func() { _ = d.Value(struct{ k int }{1}) }); n != 0 {
		t.Errorf("Value allocates %v times", n)
	}
}
