package encoding_test

import (
	"bytes"
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/receiptstore/receipts/encoding"
)

// FuzzFingerprint decodes the input as msgpack into nested any values
// (maps with keys of any decoded type, slices, numbers, strings, bytes,
// times) and fingerprints them: Fingerprint must not panic, must refuse
// only with ErrUnsupportedValue, and must give one digest for the value,
// again, and for a copy built with its map keys inserted in other orders.
//
//	go test ./encoding -run '^$' -fuzz FuzzFingerprint -fuzztime 5m
func FuzzFingerprint(f *testing.F) {
	for _, v := range []any{
		nil, 1, "s", []any{1, "a", nil}, map[string]any{"b": 1, "a": []any{2.5}},
		map[any]any{1: "x", "y": 2, true: map[any]any{int8(-1): nil}},
		[]any{map[any]any{1.5: "a", 2.5: "b", uint64(1 << 40): []byte("c")}}, time.Unix(5, 6),
	} {
		b, err := msgpack.Marshal(v)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		v, ok := decodeUntyped(b)
		if !ok {
			return
		}
		want, err := encoding.Fingerprint(v)
		if err != nil {
			if !errors.Is(err, encoding.ErrUnsupportedValue) {
				t.Fatalf("error not ErrUnsupportedValue: %v", err)
			}
			return
		}
		for range 3 {
			if got, err := encoding.Fingerprint(v); err != nil || !bytes.Equal(got, want) {
				t.Fatalf("again: %x, %v; first %x", got, err, want)
			}
		}
		for _, order := range []insertOrder{reversed, rotated} {
			cp := deepCopy(reflect.ValueOf(v), order, nil)
			var c any
			if cp.IsValid() {
				c = cp.Interface()
			}
			if got, err := encoding.Fingerprint(c); err != nil || !bytes.Equal(got, want) {
				t.Fatalf("copy: %x, %v; want %x", got, err, want)
			}
		}
	})
}

// decodeUntyped decodes one msgpack value with maps as map[any]any; ok is
// false for input msgpack rejects (or panics on: an unhashable key).
func decodeUntyped(b []byte) (v any, ok bool) {
	if rest, ok := skipMsgpack(b, 0); !ok || len(rest) != 0 {
		return nil, false
	}
	defer func() {
		if recover() != nil {
			ok = false
		}
	}()
	dec := msgpack.NewDecoder(bytes.NewReader(b))
	dec.SetMapDecoder(func(d *msgpack.Decoder) (any, error) {
		n, err := d.DecodeMapLen()
		switch {
		case err != nil:
			return nil, err
		case n < 0:
			return nil, nil
		}
		m := make(map[any]any, n)
		for range n {
			k, err := d.DecodeInterface()
			if err != nil {
				return nil, err
			}
			v, err := d.DecodeInterface()
			if err != nil {
				return nil, err
			}
			m[k] = v
		}
		return m, nil
	})
	v, err := dec.DecodeInterface()
	return v, err == nil
}

// skipMsgpack returns what follows the msgpack value at the start of b; ok
// is false if the value is malformed or declares a length longer than the
// bytes left (msgpack's decoder would allocate by it).
func skipMsgpack(b []byte, depth int) (rest []byte, ok bool) {
	if len(b) == 0 || depth > 1000 {
		return nil, false
	}
	c, b := b[0], b[1:]
	be := func(n int) (int, bool) {
		if len(b) < n {
			return 0, false
		}
		v := 0
		for _, x := range b[:n] {
			v = v<<8 | int(x)
		}
		b = b[n:]
		return v, true
	}
	var items, raw int // values that follow, bytes that follow
	switch {
	case c <= 0x7f || c >= 0xe0 || c == 0xc0 || c == 0xc2 || c == 0xc3:
	case c <= 0x8f:
		items = 2 * int(c&0x0f)
	case c <= 0x9f:
		items = int(c & 0x0f)
	case c <= 0xbf:
		raw = int(c & 0x1f)
	case c >= 0xc4 && c <= 0xc6: // bin
		n, ok := be(1 << (c - 0xc4))
		if !ok {
			return nil, false
		}
		raw = n
	case c >= 0xc7 && c <= 0xc9: // ext
		n, ok := be(1 << (c - 0xc7))
		if !ok {
			return nil, false
		}
		raw = n + 1
	case c == 0xca:
		raw = 4
	case c == 0xcb:
		raw = 8
	case c >= 0xcc && c <= 0xcf:
		raw = 1 << (c - 0xcc)
	case c >= 0xd0 && c <= 0xd3:
		raw = 1 << (c - 0xd0)
	case c >= 0xd4 && c <= 0xd8: // fixext
		raw = 1<<(c-0xd4) + 1
	case c >= 0xd9 && c <= 0xdb: // str
		n, ok := be(1 << (c - 0xd9))
		if !ok {
			return nil, false
		}
		raw = n
	case c == 0xdc || c == 0xdd:
		n, ok := be(2 << (c - 0xdc))
		if !ok {
			return nil, false
		}
		items = n
	case c == 0xde || c == 0xdf:
		n, ok := be(2 << (c - 0xde))
		if !ok {
			return nil, false
		}
		items = 2 * n
	default:
		return nil, false
	}
	if raw > len(b) || items > len(b) {
		return nil, false
	}
	b = b[raw:]
	for range items {
		if b, ok = skipMsgpack(b, depth+1); !ok {
			return nil, false
		}
	}
	return b, true
}
