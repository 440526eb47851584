package receipthttp

import (
	"errors"
	"strings"

	"github.com/receiptstore/receipts"
)

// Errors describing a bad Idempotency-Key header; each answers 400.
var (
	errKeyEmpty    = errors.New("the key is empty")
	errKeyTooLong  = errors.New("the key is longer than 255 bytes")
	errKeyInvalid  = errors.New("the key is not a valid header value (printable ASCII only)")
	errKeyMultiple = errors.New("the header is present more than once")
)

// parseKey returns the operation key carried by the header values vs.
//
// The IETF draft defines the field as a Structured Field string
// (`Idempotency-Key: "8e03978e-40d5"`); most clients, Stripe's included, send
// the bare value. Both are accepted: a value in double quotes is unquoted
// (with \" and \\ escapes), anything else is taken as it is. Either way the
// key must be 1..255 bytes of printable ASCII (0x20-0x7E, no leading or
// trailing space). ok is false when no header was sent.
func parseKey(vs []string) (key string, ok bool, err error) {
	switch len(vs) {
	case 0:
		return "", false, nil
	case 1:
	default:
		return "", true, errKeyMultiple
	}
	v := vs[0]
	if len(v) >= 2 && v[0] == '"' && v[len(v)-1] == '"' {
		var b strings.Builder
		in := v[1 : len(v)-1]
		for i := 0; i < len(in); i++ {
			c := in[i]
			switch {
			case c == '\\':
				if i+1 == len(in) || (in[i+1] != '"' && in[i+1] != '\\') {
					return "", true, errKeyInvalid
				}
				i++
				b.WriteByte(in[i])
			case c == '"':
				return "", true, errKeyInvalid
			default:
				b.WriteByte(c)
			}
		}
		v = b.String()
	}
	if v == "" {
		return "", true, errKeyEmpty
	}
	if len(v) > receipts.MaxKeyPartLen {
		return "", true, errKeyTooLong
	}
	for i := 0; i < len(v); i++ {
		if c := v[i]; c < 0x20 || c > 0x7e {
			return "", true, errKeyInvalid
		}
	}
	if v[0] == ' ' || v[len(v)-1] == ' ' {
		return "", true, errKeyInvalid
	}
	return v, true, nil
}
