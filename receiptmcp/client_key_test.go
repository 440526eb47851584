package receiptmcp

import (
	"testing"
	"time"

	"github.com/receiptstore/receipts"
)

func TestNewOperationKeyIsUUIDv7(t *testing.T) {
	before := time.Now().Truncate(time.Millisecond)
	k := NewOperationKey()
	after := time.Now()
	got, ok := receipts.UUIDv7Time(k)
	if !ok {
		t.Fatalf("NewOperationKey() = %q: not a UUIDv7", k)
	}
	if got.Before(before) || got.After(after) {
		t.Fatalf("NewOperationKey() = %q: minted at %v, not in [%v, %v]", k, got, before, after)
	}
	if NewOperationKey() == k {
		t.Fatal("two keys are equal")
	}
}
