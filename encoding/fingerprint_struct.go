package encoding

import (
	"reflect"
	"strings"
	"sync"

	"github.com/vmihailenco/msgpack/v5"
)

// Struct fields as msgpack v5.4.1 lays them out (its types.go: getFields,
// inlineFields, shouldInline, isEmptyValue), ported so that Fingerprint
// gives structs the bytes msgpack gives them while writing their fields
// itself. The encoder options Fingerprint uses are msgpack's defaults
// there: no fallback struct tag, no forced omitempty, structs as maps.

// fpField is one encoded struct field.
type fpField struct {
	name      string
	index     []int
	omitEmpty bool
}

// fpFields is the layout of one struct type.
type fpFields struct {
	list         []*fpField
	names        map[string]bool // every name taken, aliases and inlined embeddings included
	asArray      bool
	hasOmitEmpty bool
}

func (fs *fpFields) add(f *fpField) {
	fs.names[f.name] = true
	fs.list = append(fs.list, f)
	if f.omitEmpty {
		fs.hasOmitEmpty = true
	}
}

// structLayouts caches fpFields by struct type. It is a cache of a pure
// function of the type, not a setting.
var structLayouts sync.Map

func layoutOf(t reflect.Type) *fpFields {
	if fs, ok := structLayouts.Load(t); ok {
		return fs.(*fpFields)
	}
	fs := newLayout(t)
	structLayouts.Store(t, fs)
	return fs
}

func newLayout(t reflect.Type) *fpFields {
	fs := &fpFields{names: make(map[string]bool, t.NumField())}
	var omitEmpty bool
	for i := range t.NumField() {
		f := t.Field(i)
		name, opts := parseTag(f.Tag.Get("msgpack"))
		if name == "-" {
			continue
		}
		if f.Name == "_msgpack" {
			_, a := opts["as_array"]
			_, b := opts["asArray"]
			fs.asArray = a || b
			if _, ok := opts["omitempty"]; ok {
				omitEmpty = true
			}
		}
		if !f.IsExported() && !f.Anonymous {
			continue
		}
		_, oe := opts["omitempty"]
		fld := &fpField{name: name, index: f.Index, omitEmpty: omitEmpty || oe}
		if fld.name == "" {
			fld.name = f.Name
		}
		if _, noinline := opts["noinline"]; f.Anonymous && !noinline {
			_, inline := opts["inline"]
			if inline {
				inline = inlineFields(fs, f.Type, fld)
			} else {
				inline = shouldInline(fs, f.Type, fld)
			}
			if inline {
				fs.names[fld.name] = true
				continue
			}
		}
		fs.add(fld)
		if alias, ok := opts["alias"]; ok {
			fs.names[alias] = true
		}
	}
	return fs
}

// prefixed returns the fields of an embedded struct reached through f.
func prefixed(t reflect.Type, f *fpField) []*fpField {
	inner := newLayout(t).list
	out := make([]*fpField, len(inner))
	for i, g := range inner {
		out[i] = &fpField{name: g.name, index: append(append([]int(nil), f.index...), g.index...), omitEmpty: g.omitEmpty}
	}
	return out
}

// inlineFields inlines an embedded field tagged inline, but for fields
// shadowed by earlier ones. (msgpack panics for a non-struct; it is kept
// as a plain field here.)
func inlineFields(fs *fpFields, t reflect.Type, f *fpField) bool {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct {
		return false
	}
	for _, g := range prefixed(t, f) {
		if !fs.names[g.name] {
			fs.add(g)
		}
	}
	return true
}

// shouldInline inlines an untagged embedded struct, or pointer to one,
// that msgpack encodes and decodes as a plain struct, unless one of its
// fields is shadowed.
func shouldInline(fs *fpFields, t reflect.Type, f *fpField) bool {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct || !plainStruct(t) {
		return false
	}
	inner := prefixed(t, f)
	for _, g := range inner {
		if fs.names[g.name] {
			return false
		}
	}
	for _, g := range inner {
		fs.add(g)
	}
	return true
}

var (
	customDecoderType = reflect.TypeFor[msgpack.CustomDecoder]()
	unmarshalerType   = reflect.TypeFor[msgpack.Unmarshaler]()
	binaryUnmarshaler = reflect.TypeFor[interface{ UnmarshalBinary([]byte) error }]()
	textUnmarshaler   = reflect.TypeFor[interface{ UnmarshalText([]byte) error }]()
)

// plainStruct reports whether msgpack uses its struct encoder and decoder
// for struct type t: no registered type (of those, Fingerprint knows only
// time.Time) and no encoding or decoding method on t or *t.
func plainStruct(t reflect.Type) bool {
	if t == timeType {
		return false
	}
	pt := reflect.PointerTo(t)
	for _, it := range [...]reflect.Type{
		customEncoderType, marshalerType, binaryMarshaler, textMarshaler,
		customDecoderType, unmarshalerType, binaryUnmarshaler, textUnmarshaler,
	} {
		if t.Implements(it) || pt.Implements(it) {
			return false
		}
	}
	return true
}

// fieldByIndex follows index from struct v; ok is false when it passes
// through a nil embedded pointer.
func fieldByIndex(v reflect.Value, index []int) (_ reflect.Value, ok bool) {
	for i, idx := range index {
		if i > 0 {
			for v.Kind() == reflect.Pointer {
				if v.IsNil() {
					return v, false
				}
				v = v.Elem()
			}
		}
		v = v.Field(idx)
	}
	return v, true
}

// present returns the fields of v that are written.
func (fs *fpFields) present(v reflect.Value) []*fpField {
	if !fs.hasOmitEmpty {
		return fs.list
	}
	out := make([]*fpField, 0, len(fs.list))
	for _, f := range fs.list {
		// As msgpack does, once a struct has an omitempty field, a field
		// behind a nil embedded pointer is left out whatever its tag.
		fv, ok := fieldByIndex(v, f.index)
		if ok && (!f.omitEmpty || !isEmptyValue(fv)) {
			out = append(out, f)
		}
	}
	return out
}

func isEmptyValue(v reflect.Value) bool {
	kind := v.Kind()
	for kind == reflect.Interface {
		if v.IsNil() {
			return true
		}
		v = v.Elem()
		kind = v.Kind()
	}
	if v.CanInterface() {
		if z, ok := v.Interface().(interface{ IsZero() bool }); ok {
			switch kind {
			case reflect.Chan, reflect.Func, reflect.Map, reflect.Pointer, reflect.Slice:
				if v.IsNil() {
					return true
				}
			}
			return z.IsZero()
		}
	}
	switch kind {
	case reflect.Array, reflect.Map, reflect.Slice, reflect.String:
		return v.Len() == 0
	case reflect.Struct:
		return len(layoutOf(v.Type()).present(v)) == 0
	case reflect.Bool:
		return !v.Bool()
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return v.Int() == 0
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		return v.Uint() == 0
	case reflect.Float32, reflect.Float64:
		return v.Float() == 0
	case reflect.Pointer:
		return v.IsNil()
	}
	return false
}

func (w *fpWriter) structValue(v reflect.Value, depth int) error {
	fs := layoutOf(v.Type())
	fields := fs.list
	if fs.asArray {
		if err := w.enc.EncodeArrayLen(len(fields)); err != nil {
			return err
		}
	} else {
		fields = fs.present(v)
		if err := w.enc.EncodeMapLen(len(fields)); err != nil {
			return err
		}
	}
	for _, f := range fields {
		if !fs.asArray {
			if err := w.enc.EncodeString(f.name); err != nil {
				return err
			}
		}
		fv, ok := fieldByIndex(v, f.index)
		if !ok {
			fv = reflect.Value{} // nil
		}
		if err := w.value(fv, depth+1); err != nil {
			return err
		}
	}
	return nil
}

// parseTag splits a msgpack struct tag into its name and options as
// vmihailenco/tagparser does for the forms msgpack documents:
// "name,opt,key:value". (Quoted values are taken literally.)
func parseTag(tag string) (string, map[string]string) {
	var name string
	opts := map[string]string{}
	for i, part := range strings.Split(tag, ",") {
		key, value, hasValue := strings.Cut(part, ":")
		key, value = strings.TrimSpace(key), strings.TrimSpace(value)
		if i == 0 && !hasValue {
			name = key
			continue
		}
		if part == "" && i > 0 {
			continue
		}
		opts[key] = value
	}
	return name, opts
}
