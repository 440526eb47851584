package journal

import (
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/receiptstore/receipts/driver"
)

func TestRoundTrip(t *testing.T) {
	in := []Entry{
		{Name: "reserve", Fingerprint: []byte{1, 2, 3}, State: driver.Succeeded, Token: 7, At: 1_700_000_000_000_000_000, Result: []byte("seat 12A")},
		{Name: "charge", State: driver.Failed, Token: 1 << 60, At: -5, Result: []byte{}},
	}
	b := Append(nil, in)
	out, err := Decode(b)
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(in, out, cmp.Comparer(func(a, b []byte) bool { return string(a) == string(b) })); d != "" {
		t.Fatal(d)
	}
	for i := range in {
		if got := in[i].Size(); got < len(Append(nil, in[i:i+1]))-2 {
			t.Fatalf("Size %d under the encoding", got)
		}
	}
	if out, err := Decode(nil); err != nil || out != nil {
		t.Fatalf("Decode(nil) = %v, %v", out, err)
	}
	for cut := 1; cut < len(b); cut++ {
		if _, err := Decode(b[:cut]); !errors.Is(err, driver.ErrCorrupt) {
			t.Fatalf("cut at %d: %v", cut, err)
		}
	}
}

func FuzzDecode(f *testing.F) {
	f.Add(Append(nil, []Entry{{Name: "a", State: driver.Succeeded, Result: []byte("x")}}))
	f.Add([]byte{1, 0xff, 0xff, 0xff, 0xff, 0x0f})
	f.Fuzz(func(t *testing.T, b []byte) {
		es, err := Decode(b)
		if err != nil {
			if !errors.Is(err, driver.ErrCorrupt) {
				t.Fatalf("error %v does not wrap ErrCorrupt", err)
			}
			return
		}
		if len(b) > 0 && string(Append(nil, es)) != string(b) {
			// varints have one canonical form only when minimal; accept a re-decode instead
			if _, err := Decode(Append(nil, es)); err != nil {
				t.Fatalf("re-encoding does not decode: %v", err)
			}
		}
	})
}
