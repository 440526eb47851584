package receipthttp

import (
	"bytes"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"
)

func TestResponseRoundTrip(t *testing.T) {
	h := http.Header{
		"Content-Type": {"application/json"},
		"Location":     {"/items/1"},
		"Link":         {"<a>; rel=x", "<b>; rel=y"},
		"Set-Cookie":   {"secret=1"}, // not allowlisted
	}
	allow := []string{"Content-Type", "Location", "Link", "Etag"}
	b := encodeResponse(nil, 201, h, allow, []byte(`{"id":1}`))
	got, err := decodeResponse(b)
	if err != nil {
		t.Fatal(err)
	}
	if got.Status != 201 || string(got.Body) != `{"id":1}` {
		t.Fatalf("got %d %q", got.Status, got.Body)
	}
	if len(got.Header) != 3 || got.Header.Get("Location") != "/items/1" || len(got.Header["Link"]) != 2 {
		t.Fatalf("headers = %v", got.Header)
	}
	if _, ok := got.Header["Set-Cookie"]; ok {
		t.Fatal("stored a header outside the allowlist")
	}
	// Deterministic: same input, same bytes.
	if !bytes.Equal(b, encodeResponse(nil, 201, h, allow, []byte(`{"id":1}`))) {
		t.Fatal("encoding is not deterministic")
	}
}

func TestDecodeRejectsMalformed(t *testing.T) {
	good := encodeResponse(nil, 200, http.Header{"Content-Type": {"text/plain"}}, []string{"Content-Type"}, []byte("hi"))
	cases := map[string][]byte{
		"empty":           nil,
		"version":         append([]byte{9}, good[1:]...),
		"trailing":        append(append([]byte(nil), good...), 0),
		"truncated":       good[:len(good)-1],
		"status 0":        {recordV1, 0, 0, 0},
		"status 1000":     {recordV1, 0xe8, 0x07, 0, 0},
		"huge body len":   {recordV1, 200, 1, 0, 0xff, 0xff, 0xff, 0xff, 0x0f},
		"many headers":    {recordV1, 200, 1, 65},
		"many values":     {recordV1, 200, 1, 1, 'A', 17},
		"bad header name": {recordV1, 200, 1, 1, ':', 0, 0},
		"bad varint":      {recordV1, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff},
	}
	for name, b := range cases {
		if _, err := decodeResponse(b); !errors.Is(err, errBadRecord) {
			t.Errorf("%s: err = %v, want errBadRecord", name, err)
		}
	}
}

func FuzzDecodeResponse(f *testing.F) {
	f.Add(encodeResponse(nil, 201, http.Header{"Location": {"/x"}}, []string{"Location"}, []byte("body")))
	f.Add([]byte{recordV1, 200, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := decodeResponse(b)
		if err != nil {
			return
		}
		// What decodes re-encodes to the same bytes.
		allow := make([]string, 0, len(r.Header))
		for name := range r.Header {
			allow = append(allow, name)
		}
		again := encodeResponse(nil, r.Status, r.Header, allow, r.Body)
		if _, err := decodeResponse(again); err != nil {
			t.Fatalf("re-encoded record does not decode: %v", err)
		}
	})
}

func TestParseKey(t *testing.T) {
	for _, tc := range []struct {
		in      []string
		want    string
		present bool
		err     error
	}{
		{nil, "", false, nil},
		{[]string{"abc"}, "abc", true, nil},
		{[]string{`"abc"`}, "abc", true, nil},
		{[]string{`"a\"b\\c"`}, `a"b\c`, true, nil},
		{[]string{`"`}, `"`, true, nil}, // a lone quote is a bare value
		{[]string{""}, "", true, errKeyEmpty},
		{[]string{`""`}, "", true, errKeyEmpty},
		{[]string{strings.Repeat("x", 256)}, "", true, errKeyTooLong},
		{[]string{"a\tb"}, "", true, errKeyInvalid},
		{[]string{"é"}, "", true, errKeyInvalid},
		{[]string{"a", "b"}, "", true, errKeyMultiple},
		{[]string{`"a\x"`}, "", true, errKeyInvalid},
		// Stripe's bare form and the draft's quoted form name one key; a
		// comma is a key only quoted.
		{[]string{"8e03978e-40d5"}, "8e03978e-40d5", true, nil},
		{[]string{`"8e03978e-40d5"`}, "8e03978e-40d5", true, nil},
		{[]string{`"a,b"`}, "a,b", true, nil},
		{[]string{`"abc`}, `"abc`, true, nil}, // no closing quote: a bare value
		// More than one field: lines joined by an intermediary, a list.
		{[]string{"a, b"}, "", true, errKeyMultiple},
		{[]string{"a,b"}, "", true, errKeyMultiple},
		{[]string{`"a", "b"`}, "", true, errKeyMultiple},
		{[]string{`"a","b"`}, "", true, errKeyMultiple},
		{[]string{`"a" , b`}, "", true, errKeyMultiple},
		// Parameters and bytes after the string are not a key.
		{[]string{`"a";p=1`}, "", true, errKeyInvalid},
		{[]string{`"a"b"`}, "", true, errKeyInvalid},
		{[]string{`"a" `}, "a", true, nil},
	} {
		got, present, err := parseKey(tc.in)
		if got != tc.want || present != tc.present || !errors.Is(err, tc.err) {
			t.Errorf("parseKey(%q) = %q, %v, %v; want %q, %v, %v", tc.in, got, present, err, tc.want, tc.present, tc.err)
		}
	}
}

func TestDefaultPolicy(t *testing.T) {
	for status, want := range map[int]Outcome{
		200: Succeed, 201: Succeed, 204: Succeed, 303: Succeed,
		400: Fail, 404: Fail, 422: Fail,
		409: Release, 429: Release,
		500: Abandon, 502: Abandon, 503: Abandon,
	} {
		if got := DefaultPolicy(status); got != want {
			t.Errorf("DefaultPolicy(%d) = %v, want %v", status, got, want)
		}
	}
}

func TestRetryAfterSeconds(t *testing.T) {
	for d, want := range map[int64]int{0: 1, 1: 1, 1e9: 1, 1e9 + 1: 2, 30e9: 30, 1e15: 86400} {
		if got := retryAfterSeconds(time.Duration(d)); got != want {
			t.Errorf("retryAfterSeconds(%d) = %d, want %d", d, got, want)
		}
	}
}
