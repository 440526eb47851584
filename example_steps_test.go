package receipts_test

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/receiptstore/receipts"
)

// An action of three steps: reserve a seat, charge the card, send the itinerary. The first
// attempt's charge times out (did it charge?), so its outcome is unknown and the claim is
// abandoned. The retry, with the same key, gets the reservation from the journal without
// reserving again, runs the charge Recovered with the same step key (the provider
// deduplicates by it), and goes on to the itinerary.
func ExampleLease_Step() {
	dir, _ := os.MkdirTemp("", "receipts-example")
	defer os.RemoveAll(dir)
	db, err := receipts.Open(dir, nil)
	if err != nil {
		panic(err)
	}
	defer db.Close()

	ctx := context.Background()
	k := receipts.Key{Scope: "user-7", ID: "book-trip-0193"}
	timeouts := 1
	bookTrip := func(ctx context.Context, l *receipts.Lease) ([]byte, error) {
		seat, err := l.Step(ctx, "reserve", []byte("LH 400, 12A"), func(ctx context.Context, s *receipts.Step) ([]byte, error) {
			fmt.Println("reserving")
			return []byte("12A"), nil
		})
		if err != nil {
			return nil, err
		}
		charge, err := l.Step(ctx, "charge", []byte("420 EUR"), func(ctx context.Context, s *receipts.Step) ([]byte, error) {
			// Forward s.ProviderKey() as the provider's idempotency key.
			fmt.Println("charging, recovered:", s.Recovered())
			if timeouts > 0 {
				timeouts--
				return nil, errors.New("provider timed out")
			}
			return []byte("ch_1"), nil
		})
		if err != nil {
			return nil, err
		}
		_, err = l.Step(ctx, "notify", nil, func(ctx context.Context, s *receipts.Step) ([]byte, error) {
			fmt.Println("sending the itinerary")
			return nil, nil
		})
		return fmt.Appendf(nil, "seat %s, charge %s", seat, charge), err
	}
	for range 2 {
		r, err := db.Do(ctx, k, []byte("book LH 400"), bookTrip)
		if errors.Is(err, receipts.ErrOutcomeUnknown) {
			fmt.Println("outcome unknown; retry with the same key")
			continue
		}
		fmt.Printf("attempt %d: %s\n", r.Attempts, r.Result)
	}
	// Output:
	// reserving
	// charging, recovered: false
	// outcome unknown; retry with the same key
	// charging, recovered: true
	// sending the itinerary
	// attempt 2: seat 12A, charge ch_1
}
