package receipts

import (
	"testing"
	"unsafe"

	"github.com/receiptstore/receipts/driver"
)

// newReceiptCopy's receipts with room fill size classes of Go's allocator
// exactly (64-bit), as its comment says, so that a field added to Receipt
// shows here rather than as silently larger replays; and each takes the
// copies of its size, in one allocation.
func TestReceiptCopySizeClasses(t *testing.T) {
	if unsafe.Sizeof(uintptr(0)) != 8 {
		t.Skip("the size classes are those of 64-bit platforms")
	}
	// Go's size classes from 256 to 512 bytes (runtime/sizeclasses.go).
	classes := map[uintptr]bool{256: true, 288: true, 320: true, 352: true, 384: true, 416: true, 448: true, 480: true, 512: true}
	for _, c := range []struct {
		name string
		size uintptr
		room int
	}{
		{"receiptWith88", unsafe.Sizeof(receiptWith88{}), len(receiptWith88{}.b)},
		{"receiptWith152", unsafe.Sizeof(receiptWith152{}), len(receiptWith152{}.b)},
		{"receiptWith184", unsafe.Sizeof(receiptWith184{}), len(receiptWith184{}.b)},
		{"receiptWith280", unsafe.Sizeof(receiptWith280{}), len(receiptWith280{}.b)},
	} {
		if !classes[c.size] {
			t.Errorf("%s is %d bytes, not a size class (Receipt is %d bytes)", c.name, c.size, unsafe.Sizeof(Receipt{}))
		}
		rec := &driver.Record{Fingerprint: make([]byte, 32), Result: make([]byte, c.room-32)}
		if n := testing.AllocsPerRun(100, func() { _ = newReceiptCopy(rec) }); n != 1 {
			t.Errorf("%s: a receipt with %d bytes of copies takes %v allocations, want 1", c.name, c.room, n)
		}
	}
}
