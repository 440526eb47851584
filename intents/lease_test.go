package intents_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/receiptstore/receipts/intents"
)

// startMore starts n more Dispatchers on h's journal (closed at the end of
// the test), with h.start's options.
func (h *host) startMore(n int, o intents.DispatcherOptions) []*intents.Dispatcher {
	h.t.Helper()
	o.Transports = map[string]intents.Transport{"billing": h.tr}
	if o.MinBackoff == 0 {
		o.MinBackoff, o.MaxBackoff = 5*time.Millisecond, 50*time.Millisecond
	}
	var out []*intents.Dispatcher
	for range n {
		d, err := intents.NewDispatcher(h.j, o)
		if err != nil {
			h.t.Fatal(err)
		}
		h.t.Cleanup(func() { _ = d.Close() })
		out = append(out, d)
	}
	return out
}

// until polls cond every 5 ms for up to 30 s (a bounded wait, not a timing
// assertion).
func until(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(30 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("no %s within 30s", what)
		}
	}
}

// TestDispatchersShareAPebbleJournal: three Dispatchers on one Pebble
// journal deliver 30 actions: each reaches the service once (one
// Dispatcher holds its lease), has one effect, and records Attempts 1 and
// no holder once answered. Before leases each Dispatcher delivered each
// action.
func TestDispatchersShareAPebbleJournal(t *testing.T) {
	svc := newHTTPService(t)
	h := newHost(t, svc)
	h.start(intents.DispatcherOptions{})
	h.startMore(2, intents.DispatcherOptions{})
	var keys []string
	for i := range 30 {
		keys = append(keys, h.approve(fmt.Sprintf("s%d", i), 100, "POST /v1/charges").Key)
	}
	total := 0
	for i, k := range keys {
		a := h.wait(k)
		intent := fmt.Sprintf("s%d", i)
		total += svc.requestsOf(intent)
		if a.State != intents.Succeeded || svc.effectsOf(intent) != 1 || svc.requestsOf(intent) != 1 || a.Attempts != 1 {
			t.Errorf("%s: %v, %d effects, %d deliveries, Attempts %d, holder %q until %v",
				intent, a.State, svc.effectsOf(intent), svc.requestsOf(intent), a.Attempts, a.Holder, a.LeaseUntil)
		}
	}
	t.Logf("3 dispatchers, 30 actions: %d deliveries", total)
}

// TestLeaseShowsTheHolder: while an attempt is in flight, the action names
// the Dispatcher that holds it and a lease that has not ended; the other
// Dispatchers leave it alone.
func TestLeaseShowsTheHolder(t *testing.T) {
	svc := newHTTPService(t)
	release := make(chan struct{})
	svc.slow = release
	h := newHost(t, svc)
	h.start(intents.DispatcherOptions{HostName: "host-a"})
	more := h.startMore(2, intents.DispatcherOptions{})
	names := map[string]bool{"host-a": true, more[0].HostName(): true, more[1].HostName(): true}
	if len(names) != 3 || h.d.HostName() != "host-a" {
		t.Fatalf("host names %v", names)
	}
	a := h.approve("held", 100, "POST /v1/charges")
	until(t, "attempt in flight", func() bool { return svc.runs.Load() == 1 })
	got, err := h.j.Get(context.Background(), a.Key)
	if err != nil {
		t.Fatal(err)
	}
	if !names[got.Holder] || !got.LeaseUntil.After(time.Now()) || got.Attempts != 1 || got.State != intents.Approved {
		t.Fatalf("in flight: holder %q until %v, Attempts %d, %v", got.Holder, got.LeaseUntil, got.Attempts, got.State)
	}
	close(release)
	if done := h.wait(a.Key); done.State != intents.Succeeded || done.Holder != "" || svc.requestsOf("held") != 1 {
		t.Fatalf("%+v; %d deliveries", done, svc.requestsOf("held"))
	}
}

// TestCloseReleasesTheLease: a Dispatcher that waits out a long backoff
// holds the action's lease through it (another host does not deliver it
// sooner); its Close releases the lease, and another Dispatcher delivers
// the action at once, instead of after the lease.
func TestCloseReleasesTheLease(t *testing.T) {
	svc := newHTTPService(t)
	svc.down.Store(true)
	h := newHost(t, svc)
	h.start(intents.DispatcherOptions{HostName: "first", MinBackoff: time.Hour, MaxBackoff: time.Hour})
	ctx := context.Background()
	a, err := h.j.Approve(ctx, intents.Approval{Target: "billing", Operation: "POST /v1/charges",
		Arguments: charge{Intent: "r1", Amount: 1}, ApprovedBy: "alice", Deadline: time.Now().Add(2 * time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	var got *intents.Action
	until(t, "the 503 recorded", func() bool {
		var err error
		got, err = h.j.Get(ctx, a.Key)
		return err == nil && got.LastError != ""
	})
	if got.Holder != "first" || got.LeaseUntil.Before(time.Now().Add(50*time.Minute)) || got.Attempts != 1 {
		t.Fatalf("after a 503 and a 1h backoff: holder %q until %v, Attempts %d", got.Holder, got.LeaseUntil, got.Attempts)
	}
	svc.down.Store(false)
	h.startMore(1, intents.DispatcherOptions{HostName: "second"})
	if err := h.d.Close(); err != nil {
		t.Fatal(err)
	}
	h.d = nil
	done := h.wait(a.Key)
	if done.State != intents.Succeeded || done.Attempts != 2 || svc.requestsOf("r1") != 2 || svc.effectsOf("r1") != 1 {
		t.Fatalf("%+v; %d deliveries", done, svc.requestsOf("r1"))
	}
}

// TestRetryAfterBindsEveryHost: a 503 with a Retry-After too large for 32
// bits (ignored before) makes its Dispatcher hold the lease until the
// action's deadline (the 24-hour cap is past it): no other host delivers
// it meanwhile.
func TestRetryAfterBindsEveryHost(t *testing.T) {
	svc := newHTTPService(t)
	huge := "4294967296"
	svc.busyFor.Store(&huge)
	h := newHost(t, svc)
	h.start(intents.DispatcherOptions{})
	h.startMore(2, intents.DispatcherOptions{})
	a, err := h.j.Approve(context.Background(), intents.Approval{Target: "billing", Operation: "POST /v1/charges",
		Arguments: charge{Intent: "ra", Amount: 1}, ApprovedBy: "alice", Deadline: time.Now().Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	var got *intents.Action
	until(t, "the 503 recorded", func() bool {
		got, err = h.j.Get(context.Background(), a.Key)
		return err == nil && got.LastError != ""
	})
	if got.Holder == "" || got.LeaseUntil.Before(a.Deadline) || !strings.Contains(got.LastError, "retry after 24h") {
		t.Fatalf("holder %q until %v (deadline %v): %s", got.Holder, got.LeaseUntil, a.Deadline, got.LastError)
	}
	if n := svc.requestsOf("ra"); n != 1 || got.Attempts != 1 {
		t.Fatalf("%d deliveries, Attempts %d", n, got.Attempts)
	}
}

// TestHostNameInUse: a second open Dispatcher of this process under one
// HostName is refused; after the first closes, the name is free.
func TestHostNameInUse(t *testing.T) {
	svc := newHTTPService(t)
	h := newHost(t, svc)
	h.start(intents.DispatcherOptions{HostName: "web-1"})
	tr := map[string]intents.Transport{"billing": h.tr}
	if _, err := intents.NewDispatcher(h.j, intents.DispatcherOptions{Transports: tr, HostName: "web-1"}); !errors.Is(err, intents.ErrHostNameInUse) || !errors.Is(err, intents.ErrInvalid) {
		t.Fatalf("second web-1: %v", err)
	}
	if _, err := intents.NewDispatcher(h.j, intents.DispatcherOptions{Transports: tr, HostName: strings.Repeat("x", intents.MaxFieldLen+1)}); !errors.Is(err, intents.ErrTooLong) {
		t.Fatalf("long name: %v", err)
	}
	_ = h.d.Close()
	d, err := intents.NewDispatcher(h.j, intents.DispatcherOptions{Transports: tr, HostName: "web-1"})
	if err != nil {
		t.Fatal(err)
	}
	_ = d.Close()
}

// TestPebbleRestartTakesOverAtOnce: a Pebble journal is held by one
// process, so a lease found in it at open is a dead process's: the next
// process delivers the action at once, not after the lease (an hour here).
func TestPebbleRestartTakesOverAtOnce(t *testing.T) {
	svc := newHTTPService(t)
	fs := vfs.NewMem()
	ctx := context.Background()
	opts := &intents.Options{Pebble: &pebble.Options{FS: fs}, PollInterval: 20 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	j, err := intents.Open("journal", opts)
	if err != nil {
		t.Fatal(err)
	}
	a, err := j.Approve(ctx, intents.Approval{Target: "billing", Operation: "POST /v1/charges",
		Arguments: charge{Intent: "p1", Amount: 1}, ApprovedBy: "alice", Deadline: time.Now().Add(2 * time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	_ = j.Close()
	s, err := intents.OpenPebble("journal", opts) // the dead process's claim, as it left it
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Update(ctx, a.Key, []intents.State{intents.Approved}, true, func(x *intents.Action) error {
		x.Holder, x.LeaseUntil, x.Attempts = "dead-host:4711", time.Now().Add(time.Hour), 1
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	_ = s.Close()
	j, err = intents.Open("journal", opts)
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	if got, err := j.Get(ctx, a.Key); err != nil || got.Holder != "dead-host:4711" {
		t.Fatalf("%+v, %v", got, err)
	}
	d, err := intents.NewDispatcher(j, intents.DispatcherOptions{Transports: map[string]intents.Transport{"billing": &intents.HTTPTransport{BaseURL: svc.srv.URL}}})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	done, err := j.Wait(wctx, a.Key)
	if err != nil {
		t.Fatalf("not delivered while the dead process's lease runs: %v", err)
	}
	if done.State != intents.Succeeded || done.Attempts != 2 || svc.requestsOf("p1") != 1 {
		t.Fatalf("%+v; %d deliveries", done, svc.requestsOf("p1"))
	}
}
