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
	errKeyMultiple = errors.New("the header carries more than one key (two lines, a list, or a comma in an unquoted key)")
)

// parseKey returns the operation key carried by the header values vs.
//
// The IETF draft defines the field as a Structured Field string
// (`Idempotency-Key: "8e03978e-40d5"`); most clients, Stripe's included, send
// the bare value. Both are accepted: a value that begins with a double quote
// and has its closing quote is unquoted (with \" and \\ escapes), anything
// else is taken as it is. Either way the key must be 1..255 bytes of
// printable ASCII (0x20-0x7E, no leading or trailing space). ok is false
// when no header was sent.
//
// More than one field is refused (errKeyMultiple): two header lines, a list
// of strings (`"a", "b"`), and a bare value with a comma, which is how an
// intermediary joins two lines of one field (RFC 9110, section 5.3). A key
// with a comma can be sent quoted.
func parseKey(vs []string) (key string, ok bool, err error) {
	switch len(vs) {
	case 0:
		return "", false, nil
	case 1:
	default:
		return "", true, errKeyMultiple
	}
	v := vs[0]
	if s, rest, quoted, err := sfString(v); err != nil {
		return "", true, err
	} else if quoted {
		rest = strings.TrimLeft(rest, " \t")
		switch {
		case rest == "":
		case rest[0] == ',':
			return "", true, errKeyMultiple
		default: // parameters, or bytes after the string
			return "", true, errKeyInvalid
		}
		v = s
	} else if strings.Contains(v, ",") {
		return "", true, errKeyMultiple
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

// sfString reads the Structured Field string that v begins with: its
// unescaped value and what follows its closing quote. quoted is false when
// v does not begin with a quote or has no closing quote (a bare value).
func sfString(v string) (s, rest string, quoted bool, err error) {
	if len(v) < 2 || v[0] != '"' {
		return "", "", false, nil
	}
	var b strings.Builder
	for i := 1; i < len(v); i++ {
		switch c := v[i]; c {
		case '\\':
			if i+1 == len(v) || (v[i+1] != '"' && v[i+1] != '\\') {
				return "", "", false, errKeyInvalid
			}
			i++
			b.WriteByte(v[i])
		case '"':
			return b.String(), v[i+1:], true, nil
		default:
			b.WriteByte(c)
		}
	}
	return "", "", false, nil
}
