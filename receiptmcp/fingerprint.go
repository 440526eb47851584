package receiptmcp

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"

	"github.com/receiptstore/receipts/encoding"
)

// fingerprintVersion is hashed with every fingerprint, so that a change to
// the canonical form below can never match a fingerprint of the old form.
const fingerprintVersion = "receiptmcp/1"

// Fingerprint returns the fingerprint the middleware stores for a call of
// tool with the given JSON arguments: the middleware's mark (see Owns),
// then encoding.Fingerprint of the tool name and the canonical form of the
// parsed arguments. (A receiptmcp that did not mark its fingerprints stored
// the second part alone; the middleware matches those keys too.) Object key order,
// whitespace and the spelling of numbers do not matter; everything else
// does. The request's id and _meta never enter it, since they change on
// every retry. Absent, null and {} arguments fingerprint the same.
//
// Numbers are decoded exactly, not through float64 first: a number written
// without fraction or exponent that fits an int64 is that integer; any
// other number is its float64 value, which becomes an integer when it is
// integral and within int64's range. So 1, 1.0, 1e0 and 10e-1 match, and
// 2^53+1 does not match 2^53; 0.1 and 0.10 match; integers beyond int64
// (and decimals beyond float64's precision) are compared as float64.
func Fingerprint(tool string, arguments json.RawMessage) ([]byte, error) {
	args, err := canonicalArguments(arguments)
	if err != nil {
		return nil, err
	}
	fp, err := encoding.Fingerprint([]any{fingerprintVersion, tool, args})
	if err != nil {
		return nil, err
	}
	return append([]byte(fingerprintMark), fp...), nil
}

// canonicalArguments parses JSON arguments into maps, slices, strings,
// bools, nil, int64 and float64, as described at Fingerprint.
func canonicalArguments(arguments json.RawMessage) (any, error) {
	if len(bytes.TrimSpace(arguments)) == 0 {
		return map[string]any{}, nil
	}
	dec := json.NewDecoder(bytes.NewReader(arguments))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, fmt.Errorf("receiptmcp: arguments are not valid JSON: %w", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, errors.New("receiptmcp: arguments are not valid JSON: trailing data")
	}
	if v == nil {
		return map[string]any{}, nil
	}
	return canonicalize(v), nil
}

func canonicalize(v any) any {
	switch v := v.(type) {
	case map[string]any:
		for k, e := range v {
			v[k] = canonicalize(e)
		}
		return v
	case []any:
		for i, e := range v {
			v[i] = canonicalize(e)
		}
		return v
	case json.Number:
		return canonicalNumber(string(v))
	}
	return v
}

// canonicalNumber: see Fingerprint.
func canonicalNumber(s string) any {
	if i, err := strconv.ParseInt(s, 10, 64); err == nil {
		return i
	}
	// The decoder only yields well-formed numbers; out-of-range ones
	// become ±Inf, which is as canonical as anything.
	f, _ := strconv.ParseFloat(s, 64)
	if f == math.Trunc(f) && f >= math.MinInt64 && f < math.MaxInt64 {
		return int64(f)
	}
	return f
}
