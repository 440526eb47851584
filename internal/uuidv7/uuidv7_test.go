package uuidv7_test

import (
	"testing"
	"time"

	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/internal/uuidv7"
)

func TestNewReadsBack(t *testing.T) {
	at := time.Date(2022, 2, 22, 19, 22, 22, 0, time.UTC)
	k := uuidv7.New(at)
	if got, ok := receipts.UUIDv7Time(k); !ok || !got.Equal(at) {
		t.Fatalf("New(%v) = %q reads back as %v, %v", at, k, got, ok)
	}
	if uuidv7.New(at) == k {
		t.Fatal("two keys of the same millisecond are equal")
	}
	if later := uuidv7.New(at.Add(time.Millisecond)); later <= k {
		t.Fatalf("a key minted later (%q) does not sort after %q", later, k)
	}
}
