package receipthttp

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/http"
	"sort"
)

// A stored response is the receipt's Result. Its format is small, versioned
// and self-delimiting:
//
//	version   byte (= recordV1)
//	status    uvarint
//	nheaders  uvarint                  (at most maxStoredHeaders)
//	  name    uvarint length + bytes   (canonical header name)
//	  nvalues uvarint                  (at most maxHeaderValues)
//	    value uvarint length + bytes
//	body      uvarint length + bytes
//
// Decoding checks every declared length against the bytes that are actually
// there before it slices, never allocates by a declared length, and rejects
// trailing bytes, so a corrupt or hostile record yields an error, not a panic
// or a large allocation.
const recordV1 byte = 1

// Bounds on what one stored response holds.
const (
	maxStoredHeaders = 64
	maxHeaderValues  = 16
)

// errBadRecord is returned by decodeResponse for a result it cannot read.
var errBadRecord = errors.New("receipthttp: stored response is malformed")

// storedResponse is what a receipt holds about one HTTP response.
type storedResponse struct {
	Status int
	Header http.Header
	Body   []byte
}

// encodeResponse appends the encoding of status, the allowlisted subset of
// h, and body to dst.
func encodeResponse(dst []byte, status int, h http.Header, allow []string, body []byte) []byte {
	names := make([]string, 0, len(allow))
	for _, name := range allow {
		if len(h[name]) > 0 {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	if len(names) > maxStoredHeaders {
		names = names[:maxStoredHeaders]
	}
	dst = append(dst, recordV1)
	dst = binary.AppendUvarint(dst, uint64(status))
	dst = binary.AppendUvarint(dst, uint64(len(names)))
	for _, name := range names {
		vs := h[name]
		if len(vs) > maxHeaderValues {
			vs = vs[:maxHeaderValues]
		}
		dst = appendBytes(dst, name)
		dst = binary.AppendUvarint(dst, uint64(len(vs)))
		for _, v := range vs {
			dst = appendBytes(dst, v)
		}
	}
	return appendBytes(dst, body)
}

func appendBytes[T string | []byte](dst []byte, b T) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(b)))
	return append(dst, b...)
}

// decodeResponse parses a result written by encodeResponse. The returned
// body aliases nothing in b.
func decodeResponse(b []byte) (*storedResponse, error) {
	d := decoder{b: b}
	if len(b) == 0 {
		return nil, fmt.Errorf("%w: empty", errBadRecord)
	}
	if v := d.b[0]; v != recordV1 {
		return nil, fmt.Errorf("%w: unknown version %d", errBadRecord, v)
	}
	d.b = d.b[1:]
	status := d.uvarint()
	if d.err == nil && (status < 100 || status > 999) {
		return nil, fmt.Errorf("%w: status %d", errBadRecord, status)
	}
	n := d.count(maxStoredHeaders)
	h := make(http.Header, n)
	for i := 0; i < n && d.err == nil; i++ {
		name := string(d.bytes())
		nv := d.count(maxHeaderValues)
		if d.err != nil {
			break
		}
		if name == "" || !validHeaderName(name) {
			return nil, fmt.Errorf("%w: header name %q", errBadRecord, name)
		}
		vs := make([]string, 0, nv)
		for j := 0; j < nv && d.err == nil; j++ {
			vs = append(vs, string(d.bytes()))
		}
		h[http.CanonicalHeaderKey(name)] = vs
	}
	body := d.bytes()
	if d.err != nil {
		return nil, d.err
	}
	if len(d.b) != 0 {
		return nil, fmt.Errorf("%w: %d trailing bytes", errBadRecord, len(d.b))
	}
	return &storedResponse{Status: int(status), Header: h, Body: append([]byte(nil), body...)}, nil
}

type decoder struct {
	b   []byte
	err error
}

func (d *decoder) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.err = fmt.Errorf("%w: bad varint", errBadRecord)
		return 0
	}
	d.b = d.b[n:]
	return v
}

// count reads a count bounded by max.
func (d *decoder) count(max int) int {
	v := d.uvarint()
	if d.err == nil && v > uint64(max) {
		d.err = fmt.Errorf("%w: count %d over %d", errBadRecord, v, max)
		return 0
	}
	return int(v)
}

// bytes reads a length-prefixed byte string; the result aliases d.b.
func (d *decoder) bytes() []byte {
	n := d.uvarint()
	if d.err != nil {
		return nil
	}
	if n > uint64(len(d.b)) {
		d.err = fmt.Errorf("%w: length %d over the %d bytes left", errBadRecord, n, len(d.b))
		return nil
	}
	s := d.b[:n:n]
	d.b = d.b[n:]
	return s
}

// validHeaderName reports whether s is an RFC 9110 token.
func validHeaderName(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case c == '!' || c == '#' || c == '$' || c == '%' || c == '&' || c == '\'' || c == '*' ||
			c == '+' || c == '-' || c == '.' || c == '^' || c == '_' || c == '`' || c == '|' || c == '~':
		default:
			return false
		}
	}
	return s != ""
}
