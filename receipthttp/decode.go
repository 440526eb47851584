package receipthttp

import "net/http"

// ErrBadStoredResponse is wrapped by the error DecodeResponse returns for
// bytes that are not a response the middleware stored.
var ErrBadStoredResponse = errBadRecord

// DecodeResponse decodes a receipt's Result written by the middleware: the
// status, the headers it kept (Config.StoredHeaders) and the body, as a
// replay sends them. Tools that show receipts use it (receiptctl); any other
// bytes are refused with an error wrapping ErrBadStoredResponse (the format
// is versioned and checked to its last byte, so other results are told
// apart).
func DecodeResponse(result []byte) (status int, header http.Header, body []byte, err error) {
	r, err := decodeResponse(result)
	if err != nil {
		return 0, nil, nil, err
	}
	return r.Status, r.Header, r.Body, nil
}
