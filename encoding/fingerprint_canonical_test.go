package encoding_test

// Fingerprint is the same for the same value: maps of every type at any
// depth, across runs and processes; what it refuses; and that the values
// msgpack already encoded canonically keep their digests.
//
//	go test ./encoding -run 'TestFingerprint'
//	go test ./encoding -run TestFingerprintProperty -rapid.checks=2000

import (
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"reflect"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/vmihailenco/msgpack/v5"
	"pgregory.net/rapid"

	"github.com/receiptstore/receipts/encoding"
)

// reencodings is how often each value is fingerprinted: Go randomises map
// iteration order on every range, so an order-dependent encoding shows.
const reencodings = 200

type keyStruct struct {
	A int
	B string
}

type withMaps struct {
	Name    string
	Counts  map[string]int
	ByID    map[int]keyStruct
	Headers http.Header
	Query   url.Values
}

// canonicalCorpus is the fixed set of values whose encoding msgpack left to
// map iteration order. It is built the same way in every process.
func canonicalCorpus() []struct {
	name string
	v    any
} {
	counts := map[string]int{}
	byInt := map[int]string{}
	byID := map[int]keyStruct{}
	q := url.Values{}
	h := http.Header{}
	byArr := map[[2]int]string{}
	byStruct := map[keyStruct]int{}
	byFloat := map[float64]bool{}
	byUint := map[uint8][]string{}
	mixed := map[any]any{}
	for i := range 24 {
		s := fmt.Sprintf("k%d", i*7%24)
		counts[s] = i
		byInt[i*31-300] = s
		byID[i] = keyStruct{i, s}
		q.Add(s, s+"a")
		q.Add(s, s+"b")
		h.Add("X-"+s, s)
		byArr[[2]int{i % 3, i}] = s
		byStruct[keyStruct{i % 2, s}] = i
		byFloat[float64(i)/3] = i%2 == 0
		byUint[uint8(i)] = []string{s}
		mixed[s] = i
		mixed[i] = s
	}
	mixed[int8(1)] = "int8 1"
	mixed[true] = "bool"
	nested := withMaps{Name: "n", Counts: counts, ByID: byID, Headers: h, Query: q}
	return []struct {
		name string
		v    any
	}{
		{"map[string]int", counts},
		{"url.Values", q},
		{"http.Header", h},
		{"map[int]string", byInt},
		{"map[int]struct", byID},
		{"map[[2]int]string", byArr},
		{"map[struct]int", byStruct},
		{"map[float64]bool", byFloat},
		{"map[uint8][]string", byUint},
		{"map[any]any mixed keys", mixed},
		{"struct of maps", nested},
		{"pointer to struct of maps", &nested},
		{"slice of maps", []any{counts, byInt, q}},
		{"array of maps", [2]map[int]string{byInt, byInt}},
		{"pointer to map", &byInt},
		{"map[string]any holding maps", map[string]any{"counts": counts, "h": h, "deep": map[string]any{"x": []any{byID}}}},
		{"map of maps", map[string]map[int]string{"a": byInt, "b": byInt}},
		{"interface slice of pointers", []any{&counts, &q, &nested}},
	}
}

// TestFingerprintMapOrder fingerprints each value of canonicalCorpus many
// times; every run must give one digest, and a copy of the value built by
// inserting its keys in other orders must give it too.
func TestFingerprintMapOrder(t *testing.T) {
	for _, c := range canonicalCorpus() {
		t.Run(c.name, func(t *testing.T) {
			want, err := encoding.Fingerprint(c.v)
			if err != nil {
				t.Fatal(err)
			}
			for i := range reencodings {
				got, err := encoding.Fingerprint(c.v)
				if err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(got, want) {
					t.Fatalf("encoding %d: digest %x, first %x", i, got, want)
				}
			}
			for _, order := range []insertOrder{reversed, rotated} {
				cp := deepCopy(reflect.ValueOf(c.v), order, nil).Interface()
				if got, _ := encoding.Fingerprint(cp); !bytes.Equal(got, want) {
					t.Fatalf("copy with keys inserted in another order: digest %x, want %x", got, want)
				}
			}
		})
	}
}

// TestFingerprintCrossProcess compares the digests of canonicalCorpus in
// this process with those a child process (this test binary run again)
// computes: another process has other map hash seeds and other
// allocation addresses.
func TestFingerprintCrossProcess(t *testing.T) {
	if out := os.Getenv("RECEIPTS_FINGERPRINT_CHILD_OUT"); out != "" {
		if err := os.WriteFile(out, []byte(corpusDigests(t)), 0o600); err != nil {
			t.Fatal(err)
		}
		return
	}
	want := corpusDigests(t)
	for i := range 3 {
		out := t.TempDir() + "/digests"
		cmd := exec.Command(os.Args[0], "-test.run=^TestFingerprintCrossProcess$", "-test.count=1")
		cmd.Env = append(os.Environ(), "RECEIPTS_FINGERPRINT_CHILD_OUT="+out)
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("child %d: %v\n%s", i, err, b)
		}
		got, err := os.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != want {
			t.Fatalf("child %d digests differ from the parent's:\nchild:\n%s\nparent:\n%s", i, got, want)
		}
	}
}

func corpusDigests(t *testing.T) string {
	var sb strings.Builder
	for _, c := range canonicalCorpus() {
		fp, err := encoding.Fingerprint(c.v)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		fmt.Fprintf(&sb, "%s %x\n", c.name, fp)
	}
	return sb.String()
}

// msgpackEncoding is how Fingerprint encoded before it sorted every map:
// msgpack's own encoder.
func msgpackEncoding(v any) (_ []byte, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("msgpack panics: %v", r) // e.g. on `msgpack:",inline"` on a pointer
		}
	}()
	var buf bytes.Buffer
	enc := msgpack.NewEncoder(&buf)
	enc.SetSortMapKeys(true)
	enc.UseCompactInts(true)
	err = enc.Encode(v)
	return buf.Bytes(), err
}

type tagged struct {
	Renamed  int    `msgpack:"r"`
	Skipped  int    `msgpack:"-"`
	Empty    string `msgpack:",omitempty"`
	Full     string `msgpack:"full,omitempty"`
	JSONOnly int    `json:"j"`
	hidden   int
	When     time.Time `msgpack:",omitempty"`
	Err      error
	Nested   *tagged
}

type asArray struct {
	//lint:ignore U1000 msgpack reads its tag
	_msgpack struct{} `msgpack:",as_array"`
	A        int
	B        string
}

type Base struct {
	ID   int
	Name string
}

type base struct{ Shared int }

// Pair is embedded in random struct types (reflect.StructOf needs
// exported names).
type Pair struct{ A, B int }

type embeds struct {
	Base
	*base
	Extra string
}

type shadows struct {
	Base
	Name string // shadows Base.Name: Base is kept as one field
}

type inlineNo struct {
	Base `msgpack:",noinline"`
	X    int
}

type custom struct{ N int }

func (c custom) EncodeMsgpack(e *msgpack.Encoder) error { return e.EncodeMulti("custom", c.N) }

type rawMarshaler struct{}

func (rawMarshaler) MarshalMsgpack() ([]byte, error) { return []byte{0x93, 1, 2, 3}, nil }

type textPtr struct{ S string }

func (t *textPtr) MarshalText() ([]byte, error) { return []byte("text:" + t.S), nil }

type holdsTextPtr struct{ T textPtr }

type myTime struct{ time.Time }

type myString string

type stringMap map[string]any

// TestFingerprintKeepsDigests checks that the values msgpack encoded
// canonically (no map other than map[string]string/bool/any with more than
// one entry) still encode to msgpack's bytes, so the fingerprints stored
// before maps were sorted still match.
func TestFingerprintKeepsDigests(t *testing.T) {
	when := time.Date(2026, 12, 3, 7, 30, 0, 123456789, time.UTC)
	long := strings.Repeat("x", 300)
	big := map[string]any{}
	for i := range 40 {
		big[strings.Repeat("k", i%7+1)+fmt.Sprint(i)] = i
	}
	values := []any{
		nil, true, false, 0, 1, -1, 127, 128, -33, 255, 256, 65536, math.MaxInt64, math.MinInt64,
		int8(-5), int16(300), int32(-70000), uint(7), uint8(200), uint16(60000), uint32(1 << 31), uint64(math.MaxUint64),
		time.Second, 1.5, float32(2.25), math.Inf(1), math.Inf(-1), math.NaN(), float32(math.NaN()),
		"", "short", long, strings.Repeat("y", 70000), myString("named"),
		[]byte(nil), []byte{}, []byte("bytes"), [4]byte{1, 2, 3, 4}, []string{"a", "b"}, []string(nil),
		[]any{1, "two", 3.0, nil, []any{}}, [3]int{1, 2, 3}, []int(nil), []int{},
		map[string]string{"b": "1", "aa": "2", "c": "3", "": "4"},
		map[string]bool{"x": true, "yy": false, "z": true},
		big, stringMap{"b": 1, "aa": 2}, map[string]any{"nested": map[string]any{"b": []any{map[string]any{"q": 1, "p": 2}}}},
		map[int]string{1: "single entry"}, map[string]int{"single": 1}, map[int]int{}, map[string]int(nil),
		when, when.In(time.FixedZone("X", 3600)), time.Time{}, time.Unix(1<<35, 5), &when, (*time.Time)(nil),
		tagged{Renamed: 1, Skipped: 2, Full: "f", JSONOnly: 3, hidden: 4, Err: errors.New("boom"), Nested: &tagged{Renamed: 5}},
		tagged{When: when},
		asArray{A: 1, B: "b"},
		embeds{Base: Base{1, "n"}, Extra: "e"},
		embeds{Base: Base{1, "n"}, base: &base{9}, Extra: "e"},
		shadows{Base: Base{1, "inner"}, Name: "outer"},
		inlineNo{Base: Base{2, "m"}, X: 3},
		custom{7}, &custom{8}, rawMarshaler{}, []any{rawMarshaler{}}, &holdsTextPtr{T: textPtr{"a"}},
		myTime{when}, struct{ P *int }{}, &struct{ S []any }{S: []any{1, "a"}},
	}
	for i, v := range values {
		want, err := msgpackEncoding(v)
		if err != nil {
			t.Fatalf("value %d (%T): msgpack: %v", i, v, err)
		}
		got, err := encoding.CanonicalEncoding(v)
		if err != nil {
			t.Fatalf("value %d (%T): %v", i, v, err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("value %d (%T %v):\n got %x\nwant %x", i, v, v, got, want)
		}
	}
}

// TestFingerprintGolden pins a few digests computed by the Fingerprint of
// before this change (msgpack with SetSortMapKeys), so that stored
// fingerprints keep matching whatever the encoder's internals become.
func TestFingerprintGolden(t *testing.T) {
	for _, c := range []struct {
		v    any
		want string
	}{
		{"hello", "2b57c5b79a3aee10237006d2fc64b7ecd13b761867f5992f43eda5777a0726d9"},
		{[]any{"receiptmcp/1", "tool", map[string]any{"b": int64(2), "a": 1.5, "list": []any{"x", nil, true}}}, "94659eadaf45d4b4f543325ea174ad52b96399a70858478f79760e444efe8f31"},
		{map[string]string{"b": "1", "aa": "2", "c": "3"}, "ac0d407df0c3463ba771fecfe4e0d917ff0e781f53e6260e507e51733fa5366f"},
		{struct {
			A int
			B string
		}{1, "b"}, "e87148765e16597a35cab6ed91afad58cddaecb85327d417b4828ec38c8de6ce"},
		{time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC), "5ba518a8da8fe6a48729e2c27b4f91890686c255e18d9b9be4b16c4019a9cbfe"},
	} {
		fp, err := encoding.Fingerprint(c.v)
		if err != nil {
			t.Fatal(err)
		}
		if got := hex.EncodeToString(fp); got != c.want {
			t.Errorf("Fingerprint(%#v) = %s, want %s", c.v, got, c.want)
		}
	}
}

type failing struct{}

func (failing) MarshalBinary() ([]byte, error) { return nil, errFailing }

var errFailing = errors.New("cannot marshal")

type node struct {
	V    int
	Next *node
}

// TestFingerprintRefuses checks that what Fingerprint cannot encode
// canonically gets an error wrapping ErrUnsupportedValue, and no panic.
func TestFingerprintRefuses(t *testing.T) {
	x := 1
	cyc := &node{V: 1}
	cyc.Next = &node{V: 2, Next: cyc}
	selfMap := map[string]any{}
	selfMap["self"] = selfMap
	selfSlice := make([]any, 1)
	selfSlice[0] = selfSlice
	var deep any = "leaf"
	for range encoding.MaxFingerprintDepth + 10 {
		deep = []any{deep}
	}
	for _, c := range []struct {
		name string
		v    any
	}{
		{"func", func() {}},
		{"nil func", (func())(nil)},
		{"chan", make(chan int)},
		{"complex", complex(1, 2)},
		{"uintptr", uintptr(1)},
		{"unsafe.Pointer", unsafe.Pointer(&x)},
		{"func in struct", struct{ F func() }{}},
		{"chan in map", map[string]any{"c": make(chan int)}},
		{"pointer-keyed map", map[*int]int{&x: 1}},
		{"empty pointer-keyed map", map[*int]int{}},
		{"nil channel-keyed map", map[chan int]int(nil)},
		{"pointer under interface key", map[any]int{&x: 1}},
		{"pointer inside array key", map[[1]*int]int{{&x}: 1}},
		{"pointer cycle", cyc},
		{"map cycle", selfMap},
		{"slice cycle", selfSlice},
		{"too deep", deep},
		{"failing marshaler", []any{failing{}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			fp, err := encoding.Fingerprint(c.v)
			if !errors.Is(err, encoding.ErrUnsupportedValue) {
				t.Fatalf("Fingerprint = %x, %v; want ErrUnsupportedValue", fp, err)
			}
			if fp != nil {
				t.Fatalf("digest %x returned with the error", fp)
			}
		})
	}
	if _, err := encoding.Fingerprint(failing{}); !errors.Is(err, errFailing) {
		t.Fatalf("a marshaler's error is not wrapped: %v", err)
	}
	// Sharing is not a cycle.
	shared := &node{V: 3}
	if _, err := encoding.Fingerprint([]*node{shared, shared, {Next: shared}}); err != nil {
		t.Fatalf("shared pointers: %v", err)
	}
}

// TestFingerprintDocumented checks the choices the Fingerprint doc comment
// states for the cases people trip on.
func TestFingerprintDocumented(t *testing.T) {
	fp := func(v any) string {
		t.Helper()
		b, err := encoding.Fingerprint(v)
		if err != nil {
			t.Fatalf("Fingerprint(%#v): %v", v, err)
		}
		return hex.EncodeToString(b)
	}
	same := func(what string, a, b any) {
		t.Helper()
		if fp(a) != fp(b) {
			t.Errorf("%s: %#v and %#v fingerprint differently", what, a, b)
		}
	}
	differ := func(what string, a, b any) {
		t.Helper()
		if fp(a) == fp(b) {
			t.Errorf("%s: %#v and %#v fingerprint the same", what, a, b)
		}
	}
	zero := 0.0
	same("NaNs", math.NaN(), zero/zero)
	same("NaN payloads", math.NaN(), math.Float64frombits(0xfff8000000000000))
	same("float32 NaNs", float32(math.NaN()), math.Float32frombits(0xffc00001))
	same("NaN as map key", map[float64]int{math.NaN(): 1}, map[float64]int{zero / zero: 1})
	same("-0 and +0", math.Copysign(0, -1), 0.0)
	same("float32 -0 and +0", float32(math.Copysign(0, -1)), float32(0))
	differ("float and int", 1.0, 1)
	same("int types", int8(1), uint64(1))
	now := time.Now() // has a monotonic reading
	same("monotonic reading", now, now.Round(0))
	same("time zones", now, now.In(time.FixedZone("UTC+5", 5*3600)))
	differ("instants", now, now.Add(time.Nanosecond))
	same("*time.Time", &now, now)
	differ("nil and empty slice", []int(nil), []int{})
	differ("nil and empty map", map[string]int(nil), map[string]int{})
	differ("nil and empty bytes", []byte(nil), []byte{})
	same("nil slice and nil pointer", []int(nil), (*int)(nil))
	same("pointer and value", &struct{ A int }{1}, struct{ A int }{1})
	same("unexported fields ignored", tagged{hidden: 1}, tagged{hidden: 2})
	same("struct as map", struct {
		A int
		B string
	}{1, "b"}, map[string]any{"A": 1, "B": "b"})
	same("msgpack tag", struct {
		X int `msgpack:"renamed"`
	}{1}, map[string]any{"renamed": 1})
	same("json tag ignored", struct {
		X int `json:"renamed"`
	}{1}, map[string]any{"X": 1})
	same("embedded structs inlined", embeds{Base: Base{1, "n"}, Extra: "e"}, struct {
		ID     int
		Name   string
		Shared *int // behind the nil *base
		Extra  string
	}{1, "n", nil, "e"})
	same("named map", stringMap{"a": 1}, map[string]any{"a": 1})
	differ("map value", map[int]string{1: "a", 2: "b"}, map[int]string{1: "a", 2: "c"})
	differ("map key", map[int]string{1: "a", 2: "b"}, map[int]string{1: "a", 3: "b"})
}

// insertOrder permutes the keys of a map before deepCopy inserts them.
type insertOrder func(n int) []int

func reversed(n int) []int {
	p := make([]int, n)
	for i := range p {
		p[i] = n - 1 - i
	}
	return p
}

func rotated(n int) []int {
	p := make([]int, n)
	for i := range p {
		p[i] = (i + n/2 + 1) % n
	}
	return p
}

// deepCopy builds a copy of v sharing nothing with it, inserting each map's
// keys in the order order gives their sorted-by-MapKeys positions. copied
// maps pointers already copied (so shared pointers stay shared).
func deepCopy(v reflect.Value, order insertOrder, copied map[uintptr]reflect.Value) reflect.Value {
	if copied == nil {
		copied = map[uintptr]reflect.Value{}
	}
	if !v.IsValid() {
		return v
	}
	out := reflect.New(v.Type()).Elem()
	switch v.Kind() {
	case reflect.Pointer:
		if v.IsNil() {
			return out
		}
		if c, ok := copied[v.Pointer()]; ok && c.Type() == v.Type() {
			return c
		}
		p := reflect.New(v.Type().Elem())
		copied[v.Pointer()] = p
		p.Elem().Set(deepCopy(v.Elem(), order, copied))
		return p
	case reflect.Interface:
		if v.IsNil() {
			return out
		}
		out.Set(deepCopy(v.Elem(), order, copied))
	case reflect.Slice:
		if v.IsNil() {
			return out
		}
		out.Set(reflect.MakeSlice(v.Type(), v.Len(), v.Len()))
		for i := range v.Len() {
			out.Index(i).Set(deepCopy(v.Index(i), order, copied))
		}
	case reflect.Array:
		for i := range v.Len() {
			out.Index(i).Set(deepCopy(v.Index(i), order, copied))
		}
	case reflect.Map:
		if v.IsNil() {
			return out
		}
		out.Set(reflect.MakeMap(v.Type()))
		// MapRange, not MapIndex: a NaN key cannot be looked up.
		var keys, vals []reflect.Value
		for it := v.MapRange(); it.Next(); {
			keys, vals = append(keys, it.Key()), append(vals, it.Value())
		}
		for _, i := range order(len(keys)) {
			out.SetMapIndex(deepCopy(keys[i], order, copied), deepCopy(vals[i], order, copied))
		}
	case reflect.Struct:
		out.Set(v) // unexported fields, time.Time internals
		for i := range v.NumField() {
			if out.Field(i).CanSet() {
				out.Field(i).Set(deepCopy(v.Field(i), order, copied))
			}
		}
	default:
		out.Set(v)
	}
	return out
}

// TestFingerprintProperty fingerprints random values of random nested
// types (maps of several key types, slices, arrays, pointers, structs,
// interfaces): re-encoding gives one digest, and so does a copy built
// independently with its map keys inserted in another order.
func TestFingerprintProperty(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		typ := genType(t, 0)
		v := genValue(t, typ, 0, false)
		want, err := encoding.Fingerprint(v.Interface())
		if err != nil {
			t.Fatalf("%s: %v", typ, err)
		}
		for i := range 20 {
			if got, _ := encoding.Fingerprint(v.Interface()); !bytes.Equal(got, want) {
				t.Fatalf("%s: encoding %d: digest %x, first %x", typ, i, got, want)
			}
		}
		shuffle := func(n int) []int {
			return rapid.Permutation(seq(n)).Draw(t, "order")
		}
		for _, order := range []insertOrder{reversed, shuffle} {
			cp := deepCopy(v, order, nil)
			if got, _ := encoding.Fingerprint(cp.Interface()); !bytes.Equal(got, want) {
				t.Fatalf("%s: copy with keys inserted in another order: digest %x, want %x", typ, got, want)
			}
		}
	})
}

func seq(n int) []int {
	s := make([]int, n)
	for i := range s {
		s[i] = i
	}
	return s
}

var (
	leafTypes = []reflect.Type{
		reflect.TypeFor[int](), reflect.TypeFor[int8](), reflect.TypeFor[uint16](), reflect.TypeFor[uint64](),
		reflect.TypeFor[string](), reflect.TypeFor[bool](), reflect.TypeFor[float64](), reflect.TypeFor[float32](),
		reflect.TypeFor[[]byte](), reflect.TypeFor[time.Time](), reflect.TypeFor[myString](),
	}
	keyTypes = []reflect.Type{
		reflect.TypeFor[string](), reflect.TypeFor[int](), reflect.TypeFor[int32](), reflect.TypeFor[uint8](),
		reflect.TypeFor[float64](), reflect.TypeFor[bool](), reflect.TypeFor[[2]int16](), reflect.TypeFor[keyStruct](),
		reflect.TypeFor[myString](), reflect.TypeFor[any](),
	}
	anyType    = reflect.TypeFor[any]()
	structTags = []reflect.StructTag{"", "", `msgpack:",omitempty"`, `msgpack:"-"`, `msgpack:"renamed"`, `msgpack:"F0,omitempty"`,
		`json:"j"`, `msgpack:"Name"`, `msgpack:",inline"`, `msgpack:",noinline"`}
	embeddable = []reflect.Type{reflect.TypeFor[Base](), reflect.TypeFor[*Base](), reflect.TypeFor[Pair](), reflect.TypeFor[*Pair]()}
)

// genType draws a random type, nesting up to 4 levels.
func genType(t *rapid.T, depth int) reflect.Type {
	n := 7
	if depth >= 4 {
		n = 0
	}
	switch rapid.IntRange(0, n).Draw(t, "kind") {
	case 0:
		return rapid.SampledFrom(leafTypes).Draw(t, "leaf")
	case 1:
		return reflect.SliceOf(genType(t, depth+1))
	case 2:
		return reflect.ArrayOf(2, genType(t, depth+1))
	case 3:
		return reflect.MapOf(rapid.SampledFrom(keyTypes).Draw(t, "key"), genType(t, depth+1))
	case 4:
		// The maps msgpack's SetSortMapKeys sorted.
		return reflect.MapOf(reflect.TypeFor[string](), rapid.SampledFrom([]reflect.Type{anyType, anyType, reflect.TypeFor[string](), reflect.TypeFor[bool]()}).Draw(t, "sorted elem"))
	case 5:
		return reflect.PointerTo(genType(t, depth+1))
	case 6:
		return anyType
	default:
		fields := make([]reflect.StructField, rapid.IntRange(1, 3).Draw(t, "fields"))
		for i := range fields {
			fields[i] = reflect.StructField{Name: fmt.Sprintf("F%d", i), Type: genType(t, depth+1)}
			fields[i].Tag = rapid.SampledFrom(structTags).Draw(t, "tag")
		}
		if e := rapid.IntRange(0, 5).Draw(t, "embed"); e < len(embeddable) {
			et := embeddable[e]
			name := et.Name()
			if et.Kind() == reflect.Pointer {
				name = et.Elem().Name()
			}
			f := reflect.StructField{Name: name, Type: et, Anonymous: true, Tag: rapid.SampledFrom(structTags).Draw(t, "tag")}
			fields = append(fields, f) // after the fields that may shadow its own
		}
		return reflect.StructOf(fields)
	}
}

// genValue draws a random value of typ; inKey if it is (in) a map key.
func genValue(t *rapid.T, typ reflect.Type, depth int, inKey bool) reflect.Value {
	v := reflect.New(typ).Elem()
	switch typ.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		v.SetInt(rapid.Int64().Draw(t, "int"))
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		v.SetUint(rapid.Uint64().Draw(t, "uint"))
	case reflect.String:
		v.SetString(rapid.StringN(0, 12, -1).Draw(t, "string"))
	case reflect.Bool:
		v.SetBool(rapid.Bool().Draw(t, "bool"))
	case reflect.Float32, reflect.Float64:
		v.SetFloat(rapid.SampledFrom([]float64{0, math.Copysign(0, -1), 1, -2.5, math.NaN(), math.Inf(1), 1e300, 0.1}).Draw(t, "float"))
	case reflect.Struct:
		if typ == reflect.TypeFor[time.Time]() {
			v.Set(reflect.ValueOf(time.Unix(rapid.Int64Range(-1<<40, 1<<40).Draw(t, "sec"), rapid.Int64Range(0, 999999999).Draw(t, "ns"))))
			break
		}
		for i := range typ.NumField() {
			v.Field(i).Set(genValue(t, typ.Field(i).Type, depth+1, inKey))
		}
	case reflect.Slice:
		if rapid.IntRange(0, 7).Draw(t, "nil") == 0 {
			break
		}
		n := rapid.IntRange(0, 4).Draw(t, "len")
		v.Set(reflect.MakeSlice(typ, n, n))
		for i := range n {
			v.Index(i).Set(genValue(t, typ.Elem(), depth+1, inKey))
		}
	case reflect.Array:
		for i := range typ.Len() {
			v.Index(i).Set(genValue(t, typ.Elem(), depth+1, inKey))
		}
	case reflect.Map:
		if rapid.IntRange(0, 7).Draw(t, "nil") == 0 {
			break
		}
		v.Set(reflect.MakeMap(typ))
		for range rapid.IntRange(0, 8).Draw(t, "entries") {
			v.SetMapIndex(genValue(t, typ.Key(), depth+1, true), genValue(t, typ.Elem(), depth+1, inKey))
		}
	case reflect.Pointer:
		if rapid.IntRange(0, 4).Draw(t, "nil") > 0 {
			p := reflect.New(typ.Elem())
			p.Elem().Set(genValue(t, typ.Elem(), depth+1, inKey))
			v.Set(p)
		}
	case reflect.Interface:
		// Under a map key only hashable, pointer-free dynamic types.
		et := rapid.SampledFrom(leafTypes[:8]).Draw(t, "dynamic")
		if inKey {
			et = rapid.SampledFrom(append(leafTypes[:8:8], keyTypes[:9]...)).Draw(t, "dynamic key")
		} else if depth < 4 && rapid.Bool().Draw(t, "composite") {
			et = genType(t, depth+1)
		}
		if rapid.IntRange(0, 5).Draw(t, "nil") > 0 {
			v.Set(genValue(t, et, depth+1, inKey))
		}
	}
	return v
}

// TestFingerprintMatchesMsgpackProperty checks, over random values of
// random nested types, that wherever msgpack's own encoding was already
// canonical (no map with two or more entries other than
// map[string]string/bool/any, no NaN, no -0), Fingerprint writes
// msgpack's bytes: the digests stored before maps were sorted still match.
func TestFingerprintMatchesMsgpackProperty(t *testing.T) {
	compared := 0
	rapid.Check(t, func(t *rapid.T) {
		typ := genType(t, 0)
		v := genValue(t, typ, 0, false)
		if !msgpackCanonical(v) {
			return
		}
		want, err := msgpackEncoding(v.Interface())
		if err != nil {
			return // not something Fingerprint accepted before
		}
		compared++
		got, err := encoding.CanonicalEncoding(v.Interface())
		if err != nil {
			t.Fatalf("%s: %v", typ, err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("%s %#v:\n got %x\nwant %x", typ, v.Interface(), got, want)
		}
	})
	if compared == 0 {
		t.Fatal("no value was compared")
	}
	t.Logf("%d values compared with msgpack's encoding", compared)
}

// msgpackCanonical reports whether msgpack alone encodes v the same way
// every time, with the floats Fingerprint leaves alone.
func msgpackCanonical(v reflect.Value) bool {
	switch v.Kind() {
	case reflect.Float32, reflect.Float64:
		f := v.Float()
		return !math.IsNaN(f) && (f != 0 || !math.Signbit(f))
	case reflect.Pointer, reflect.Interface:
		return v.IsNil() || msgpackCanonical(v.Elem())
	case reflect.Slice, reflect.Array:
		for i := range v.Len() {
			if !msgpackCanonical(v.Index(i)) {
				return false
			}
		}
	case reflect.Map:
		t := v.Type()
		sorted := t.Key() == reflect.TypeFor[string]() &&
			(t.Elem() == reflect.TypeFor[string]() || t.Elem() == reflect.TypeFor[bool]() || t.Elem() == anyType)
		if v.Len() > 1 && !sorted {
			return false
		}
		for it := v.MapRange(); it.Next(); {
			if !msgpackCanonical(it.Key()) || !msgpackCanonical(it.Value()) {
				return false
			}
		}
	case reflect.Struct:
		for i := range v.NumField() {
			if !msgpackCanonical(v.Field(i)) {
				return false
			}
		}
	}
	return true
}

// BenchmarkFingerprint compares Fingerprint with msgpack's encoder alone
// (the Fingerprint of before, which sorted only some maps) on typical
// arguments.
//
//	go test ./encoding -run '^$' -bench BenchmarkFingerprint -benchmem
func BenchmarkFingerprint(b *testing.B) {
	args := map[string]any{
		"amount": 1250, "currency": "EUR", "order": "ord_8f3a2c", "capture": true,
		"items":    []any{map[string]any{"sku": "A-1", "qty": 2}, map[string]any{"sku": "B-7", "qty": 1}},
		"metadata": map[string]string{"channel": "web", "campaign": "winter"},
		"counts":   map[string]int{"a": 1, "b": 2, "c": 3},
	}
	b.Run("msgpack-floor", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := msgpackEncoding(args); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("canonical-encoding", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := encoding.CanonicalEncoding(args); err != nil {
				b.Fatal(err)
			}
		}
	})
}
