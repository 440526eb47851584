package intentspg_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/receiptstore/receipts/intents"
	"github.com/receiptstore/receipts/intents/intentspg"
)

// TestUncertainStep: on PostgreSQL, the step a service names in its
// "outcome unknown" answer (503, problem details with "step") is kept in
// the uncertain action (Action.UncertainStep): another host's journal on
// the same schema reads it, and an answer clears it.
func TestUncertainStep(t *testing.T) {
	leakCheck(t)
	ctx := context.Background()
	p, schema := pool(t)
	ok := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-ok:
			w.WriteHeader(http.StatusCreated)
			return
		default:
		}
		w.Header().Set("Content-Type", "application/problem+json")
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = io.WriteString(w, `{"type":"https://receipts.dev/problems/outcome-unknown","status":503,"step":"charge"}`)
	}))
	defer srv.Close()
	tr := map[string]intents.Transport{"trips": &intents.HTTPTransport{BaseURL: srv.URL}}
	j, err := intentspg.Open(ctx, p, &intentspg.Options{Schema: schema, Journal: &intents.Options{PollInterval: 20 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	d, err := intents.NewDispatcher(j, intents.DispatcherOptions{Transports: tr, MinBackoff: 5 * time.Millisecond, MaxBackoff: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	a, err := j.Approve(ctx, intents.Approval{Target: "trips", Operation: "POST /v1/trips", ApprovedBy: "alice",
		Deadline: time.Now().Add(300 * time.Millisecond)})
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	got, err := j.Wait(wctx, a.Key)
	if err != nil || got.State != intents.Uncertain || got.UncertainStep != "charge" {
		t.Fatalf("%+v, %v", got, err)
	}
	_ = d.Close()

	other, err := intentspg.Open(ctx, p, &intentspg.Options{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if b, err := other.Get(ctx, a.Key); err != nil || b.UncertainStep != "charge" {
		t.Fatalf("another host reads %+v, %v", b, err)
	}

	close(ok)
	if _, err := j.Redeliver(ctx, a.Key, time.Now().Add(30*time.Second)); err != nil {
		t.Fatal(err)
	}
	d, err = intents.NewDispatcher(j, intents.DispatcherOptions{Transports: tr})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	got, err = j.Wait(wctx, a.Key)
	if err != nil || got.State != intents.Succeeded || got.UncertainStep != "" {
		t.Fatalf("answered: %+v, %v", got, err)
	}
}
