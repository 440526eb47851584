package encoding

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"math"
	"reflect"
	"slices"
	"time"

	"github.com/vmihailenco/msgpack/v5"
)

// FingerprintSize is the length of what Fingerprint returns.
const FingerprintSize = sha256.Size

// ErrUnsupportedValue is returned (wrapped) by Fingerprint for a value it
// cannot encode canonically: see Fingerprint for the list.
var ErrUnsupportedValue = errors.New("encoding: value cannot be fingerprinted")

// MaxFingerprintDepth is how deeply Fingerprint follows nested pointers,
// interfaces, slices, arrays, maps and structs before it gives up with
// ErrUnsupportedValue.
const MaxFingerprintDepth = 10000

// Fingerprint returns the SHA-256 digest of the canonical msgpack encoding of
// v. Use it as the fingerprint of an intent: the arguments of the action a
// key stands for. The same value gives the same digest at any depth, in
// every process and run; the raw arguments are never stored.
//
// The encoding is msgpack's (vmihailenco/msgpack/v5, with compact integers)
// except where msgpack's own is not canonical:
//
//   - Maps of every type, at any depth, are written with their entries
//     sorted: keys that encode as msgpack strings first, by their bytes
//     (the order msgpack's SetSortMapKeys gives map[string]string,
//     map[string]bool and map[string]any, so their digests are unchanged),
//     then every other key by its encoded bytes; entries whose keys encode
//     the same (int8(1) and int64(1) under an interface key) by their
//     encoded values. So map[string]int, url.Values, http.Header,
//     map[int]T, map[[2]int]T, map[struct{...}]T and map[any]T keyed by
//     any of these all fingerprint the same whatever the iteration order.
//   - Every NaN is written as math.NaN() (float32 NaNs as
//     float32(math.NaN())), so all NaNs fingerprint alike, and -0.0 is
//     written as +0.0, since the two compare equal.
//   - Types registered with msgpack.Register or msgpack.RegisterExt are
//     walked like any other type: a fingerprint must not depend on what
//     some package registered in this process. Only time.Time is special.
//   - A struct field tagged `msgpack:",intern"` is written in full.
//
// Otherwise the bytes are msgpack's, so values that msgpack already
// encoded canonically (nil, bools, numbers, strings, []byte, slices and
// arrays, time.Time, map[string]string/bool/any, structs of these) keep the
// digest they had before maps of other types were sorted; the exceptions
// are values holding a NaN other than math.NaN() or a -0.0, or using the
// two options above.
//
// What people trip on:
//
//   - Integers keep no type: int8(1), int64(1) and uint(1) agree. Floats
//     keep theirs: 1 and 1.0 differ, as do float32(0.5) and 0.5. Callers
//     that receive numbers as JSON should normalise them first (for example
//     decode with json.Number and convert integral values to int64).
//   - nil is not empty: a nil slice, map, []byte, pointer or interface is
//     msgpack nil (all alike), an empty slice or map is an empty array or
//     map. A non-nil pointer is the value it points to (so &x and x agree).
//   - time.Time is its instant (Unix seconds and nanoseconds): the
//     location and the monotonic clock reading are ignored, so equal
//     instants in different zones agree. A type that embeds time.Time
//     gets time.Time's MarshalBinary, which keeps the zone offset.
//   - Structs are msgpack maps from field name to value, in declaration
//     order. msgpack tags are honoured (a name, "-", omitempty, as_array
//     on a _msgpack field, inline and noinline); json tags are not.
//     Unexported fields are ignored. An embedded struct (or pointer to
//     one) is inlined, its fields promoted, as msgpack does; a nil embedded
//     pointer's fields are nil.
//   - A value whose type implements msgpack.CustomEncoder,
//     msgpack.Marshaler, encoding.BinaryMarshaler or encoding.TextMarshaler
//     (on the value or, as msgpack allows, on its pointer) is written as
//     that method writes it, the first in that order; whether its output is
//     canonical is up to the type. json.Marshaler is ignored. A struct field
//     of interface type error is its Error() string.
//
// Refused, with an error wrapping ErrUnsupportedValue: a func, channel,
// complex, uintptr or unsafe.Pointer value anywhere (even a nil one); maps
// keyed by pointers or channels (even empty: such a map is keyed by
// identity, which an encoding cannot show) and keys that hold a pointer
// under an interface, array or struct field;
// cycles (through pointers, maps or slices); nesting deeper than
// MaxFingerprintDepth; custom-encoding methods that fail (their error is
// wrapped too) or that sit on a value read from an unexported embedded
// field.
func Fingerprint(v any) ([]byte, error) {
	b, err := canonicalEncoding(v)
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(b)
	return sum[:], nil
}

// canonicalEncoding returns the bytes Fingerprint hashes.
func canonicalEncoding(v any) ([]byte, error) {
	w := &fpWriter{}
	w.enc = msgpack.NewEncoder(&w.buf)
	w.enc.SetSortMapKeys(true)
	w.enc.UseCompactInts(true)
	if err := w.value(reflect.ValueOf(v), 0); err != nil {
		return nil, fmt.Errorf("encoding: fingerprint: %w", err)
	}
	return w.buf.Bytes(), nil
}

var (
	timeType          = reflect.TypeFor[time.Time]()
	errorType         = reflect.TypeFor[error]()
	customEncoderType = reflect.TypeFor[msgpack.CustomEncoder]()
	marshalerType     = reflect.TypeFor[msgpack.Marshaler]()
	binaryMarshaler   = reflect.TypeFor[interface{ MarshalBinary() ([]byte, error) }]()
	textMarshaler     = reflect.TypeFor[interface{ MarshalText() ([]byte, error) }]()
)

// cycleCheckDepth is the depth from which pointers, maps and slices on the
// current path are remembered to detect cycles (as encoding/json does):
// shallow values, the common case, pay nothing for it.
const cycleCheckDepth = 64

// fpWriter writes the canonical encoding of one value into buf, through
// msgpack's Encoder for the primitives.
type fpWriter struct {
	buf    bytes.Buffer
	enc    *msgpack.Encoder
	inKey  int                // > 0 while a map key is being written
	onPath map[visit]struct{} // containers on the current path, past cycleCheckDepth
}

// visit identifies a container for cycle detection.
type visit struct {
	ptr uintptr
	typ reflect.Type
	n   int
}

func unsupported(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrUnsupportedValue, fmt.Sprintf(format, args...))
}

// enter records container v on the current path; leave must be called
// with the same arguments when done with it.
func (w *fpWriter) enter(v reflect.Value, depth int) (visit, bool, error) {
	if depth < cycleCheckDepth {
		return visit{}, false, nil
	}
	k := visit{ptr: v.Pointer(), typ: v.Type()}
	if v.Kind() == reflect.Slice {
		k.n = v.Len()
	}
	if w.onPath == nil {
		w.onPath = make(map[visit]struct{})
	}
	if _, ok := w.onPath[k]; ok {
		return k, false, unsupported("cycle through %s", v.Type())
	}
	w.onPath[k] = struct{}{}
	return k, true, nil
}

func (w *fpWriter) leave(k visit, entered bool) {
	if entered {
		delete(w.onPath, k)
	}
}

// value writes v, whose static type is v.Type().
func (w *fpWriter) value(v reflect.Value, depth int) error {
	if !v.IsValid() {
		return w.enc.EncodeNil()
	}
	if depth > MaxFingerprintDepth {
		return unsupported("nested deeper than %d", MaxFingerprintDepth)
	}
	t := v.Type()
	kind := t.Kind()
	if w.inKey > 0 && (kind == reflect.Pointer || kind == reflect.UnsafePointer) {
		return unsupported("map key of pointer type %s", t)
	}
	if t == timeType {
		if !v.CanInterface() {
			return unsupported("%s in an unexported field", t)
		}
		return w.enc.EncodeTime(v.Interface().(time.Time))
	}
	if kind == reflect.Pointer && t.Elem() == timeType {
		// msgpack checks its registered types (time.Time) before the
		// methods *time.Time has.
		return w.pointer(v, depth)
	}
	if done, err := w.custom(v, depth); done {
		return err
	}
	if t == errorType {
		if v.IsNil() {
			return w.enc.EncodeNil()
		}
		if !v.CanInterface() {
			return unsupported("%s in an unexported field", t)
		}
		return w.enc.EncodeString(v.Interface().(error).Error())
	}
	switch kind {
	case reflect.Bool:
		return w.enc.EncodeBool(v.Bool())
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return w.enc.EncodeInt(v.Int())
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return w.enc.EncodeUint(v.Uint())
	case reflect.Float32:
		f := float32(v.Float())
		switch {
		case f != f:
			f = math.Float32frombits(0x7fc00000) // float32(math.NaN())
		case f == 0:
			f = 0
		}
		return w.enc.EncodeFloat32(f)
	case reflect.Float64:
		f := v.Float()
		switch {
		case math.IsNaN(f):
			f = math.NaN()
		case f == 0:
			f = 0
		}
		return w.enc.EncodeFloat64(f)
	case reflect.String:
		return w.enc.EncodeString(v.String())
	case reflect.Interface:
		if v.IsNil() {
			return w.enc.EncodeNil()
		}
		return w.value(v.Elem(), depth+1)
	case reflect.Pointer:
		return w.pointer(v, depth)
	case reflect.Slice:
		if t.Elem().Kind() == reflect.Uint8 {
			return w.enc.EncodeBytes(v.Bytes()) // nil is nil
		}
		if v.IsNil() {
			return w.enc.EncodeNil()
		}
		k, entered, err := w.enter(v, depth)
		if err != nil {
			return err
		}
		defer w.leave(k, entered)
		return w.array(v, depth)
	case reflect.Array:
		if t.Elem().Kind() == reflect.Uint8 {
			n := v.Len()
			if err := w.enc.EncodeBytesLen(n); err != nil {
				return err
			}
			for i := range n {
				w.buf.WriteByte(byte(v.Index(i).Uint()))
			}
			return nil
		}
		return w.array(v, depth)
	case reflect.Map:
		return w.mapValue(v, depth)
	case reflect.Struct:
		return w.structValue(v, depth)
	}
	// Func, Chan, Complex64, Complex128, Uintptr, UnsafePointer.
	return unsupported("%s", t)
}

func (w *fpWriter) pointer(v reflect.Value, depth int) error {
	if v.IsNil() {
		return w.enc.EncodeNil()
	}
	k, entered, err := w.enter(v, depth)
	if err != nil {
		return err
	}
	defer w.leave(k, entered)
	return w.value(v.Elem(), depth+1)
}

func (w *fpWriter) array(v reflect.Value, depth int) error {
	n := v.Len()
	if err := w.enc.EncodeArrayLen(n); err != nil {
		return err
	}
	for i := range n {
		if err := w.value(v.Index(i), depth+1); err != nil {
			return err
		}
	}
	return nil
}

// custom writes v through its own encoding method, if its type has one
// that msgpack would call, and reports whether it did.
func (w *fpWriter) custom(v reflect.Value, depth int) (bool, error) {
	t := v.Type()
	recv := v
	var m reflect.Type
	for _, it := range [...]reflect.Type{customEncoderType, marshalerType, binaryMarshaler, textMarshaler} {
		if t.Implements(it) {
			m = it
			break
		}
	}
	if m == nil && t.Kind() != reflect.Pointer {
		pt := reflect.PointerTo(t)
		for _, it := range [...]reflect.Type{customEncoderType, marshalerType, binaryMarshaler, textMarshaler} {
			if pt.Implements(it) {
				m = it
				break
			}
		}
		if m == nil {
			return false, nil
		}
		if !v.CanInterface() {
			return true, unsupported("%s in an unexported field", t)
		}
		if v.CanAddr() {
			recv = v.Addr()
		} else {
			// msgpack refuses a value it cannot take the address of;
			// a copy has the same content.
			recv = reflect.New(t)
			recv.Elem().Set(v)
		}
	} else if m == nil {
		return false, nil
	} else {
		if !v.CanInterface() {
			return true, unsupported("%s in an unexported field", t)
		}
		switch t.Kind() {
		case reflect.Chan, reflect.Func, reflect.Interface, reflect.Map, reflect.Pointer, reflect.Slice:
			if v.IsNil() {
				return true, w.enc.EncodeNil()
			}
		}
	}
	var err error
	switch m {
	case customEncoderType:
		err = recv.Interface().(msgpack.CustomEncoder).EncodeMsgpack(w.enc)
	case marshalerType:
		var b []byte
		if b, err = recv.Interface().(msgpack.Marshaler).MarshalMsgpack(); err == nil {
			w.buf.Write(b)
		}
	case binaryMarshaler:
		var b []byte
		if b, err = recv.Interface().(interface{ MarshalBinary() ([]byte, error) }).MarshalBinary(); err == nil {
			err = w.enc.EncodeBytes(b)
		}
	case textMarshaler:
		var b []byte
		if b, err = recv.Interface().(interface{ MarshalText() ([]byte, error) }).MarshalText(); err == nil {
			err = w.enc.EncodeBytes(b)
		}
	}
	if err != nil {
		return true, fmt.Errorf("%w: %s: %w", ErrUnsupportedValue, t, err)
	}
	return true, nil
}

// mapEntry locates one encoded entry of a map being written, as offsets
// into the copy of the map's bytes.
type mapEntry struct{ k0, k1, v1 int }

func (w *fpWriter) mapValue(v reflect.Value, depth int) error {
	switch kt := v.Type().Key(); kt.Kind() {
	case reflect.Pointer, reflect.UnsafePointer, reflect.Chan:
		// Refused by type, even when empty: keys compared by identity.
		return unsupported("map keyed by %s", kt)
	}
	if v.IsNil() {
		return w.enc.EncodeNil()
	}
	k, entered, err := w.enter(v, depth)
	if err != nil {
		return err
	}
	defer w.leave(k, entered)
	if err := w.enc.EncodeMapLen(v.Len()); err != nil {
		return err
	}
	start := w.buf.Len()
	ents := make([]mapEntry, 0, v.Len())
	it := v.MapRange()
	for it.Next() {
		k0 := w.buf.Len()
		w.inKey++
		err := w.value(it.Key(), depth+1)
		w.inKey--
		if err != nil {
			return err
		}
		k1 := w.buf.Len()
		if err := w.value(it.Value(), depth+1); err != nil {
			return err
		}
		ents = append(ents, mapEntry{k0 - start, k1 - start, w.buf.Len() - start})
	}
	if len(ents) < 2 {
		return nil
	}
	region := bytes.Clone(w.buf.Bytes()[start:])
	slices.SortFunc(ents, func(a, b mapEntry) int {
		if c := compareKeys(region[a.k0:a.k1], region[b.k0:b.k1]); c != 0 {
			return c
		}
		return bytes.Compare(region[a.k1:a.v1], region[b.k1:b.v1])
	})
	w.buf.Truncate(start)
	for _, e := range ents {
		w.buf.Write(region[e.k0:e.v1])
	}
	return nil
}

// compareKeys orders encoded map keys: msgpack strings first, by their
// content (as sort.Strings does), then the rest by their bytes.
func compareKeys(a, b []byte) int {
	sa, aok := strPayload(a)
	sb, bok := strPayload(b)
	switch {
	case aok && bok:
		if c := bytes.Compare(sa, sb); c != 0 {
			return c
		}
	case aok:
		return -1
	case bok:
		return 1
	}
	return bytes.Compare(a, b)
}

// strPayload returns the content of b if it is exactly one msgpack string.
func strPayload(b []byte) ([]byte, bool) {
	if len(b) == 0 {
		return nil, false
	}
	var h int
	switch c := b[0]; {
	case c >= 0xa0 && c <= 0xbf:
		h = 1
	case c == 0xd9:
		h = 2
	case c == 0xda:
		h = 3
	case c == 0xdb:
		h = 5
	default:
		return nil, false
	}
	if len(b) < h {
		return nil, false
	}
	return b[h:], true
}
