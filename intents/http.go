package intents

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// DefaultKeyHeader is the header HTTPTransport sends the key in: the IETF
// draft's, which receipthttp and Stripe read.
const DefaultKeyHeader = "Idempotency-Key"

// HTTPTransport delivers actions as HTTP requests with the key in the
// Idempotency-Key header. An action's Operation is a method and a path
// ("POST /v1/charges"), resolved against BaseURL; its Arguments are the
// JSON body (none when they are null).
//
// Answers (see State):
//   - 2xx, 3xx: Succeeded (Idempotent-Replayed: true sets Answer.Replayed);
//   - 422: Conflict; 410: Expired;
//   - 408, 409 (the key in progress), 425, 429, 5xx, and no response at
//     all: no answer yet; the Dispatcher retries after Retry-After, if
//     the response has one. A JSON body (problem details) with a "step"
//     string names the step of the service's action whose outcome is
//     unknown: it is recorded in Action.UncertainStep (a *StepError);
//   - any other 4xx: Failed, a definitive failure the service stores.
//
// Redirects are not followed (a 3xx is the answer).
type HTTPTransport struct {
	// BaseURL is the service's URL, e.g. "http://127.0.0.1:8080". Required.
	BaseURL string
	// Client sends the requests. Default: a client that does not follow
	// redirects and is bounded by the attempt's context alone.
	Client *http.Client
	// Header is added to every request (Authorization, say).
	Header http.Header
	// KeyHeader names the key's header. Default DefaultKeyHeader.
	KeyHeader string
}

var defaultHTTPClient = &http.Client{
	CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
}

// Deliver implements Transport.
func (t *HTTPTransport) Deliver(ctx context.Context, a *Action) (*Answer, error) {
	method, path, ok := strings.Cut(a.Operation, " ")
	if !ok || method == "" || !strings.HasPrefix(path, "/") {
		// Never sendable: a definitive failure, not something to retry.
		return &Answer{State: Failed, Code: "intents/bad-operation",
			Body: []byte(fmt.Sprintf("operation %q is not \"METHOD /path\"", a.Operation))}, nil
	}
	var body io.Reader
	if len(a.Arguments) > 0 && string(a.Arguments) != "null" {
		body = bytes.NewReader(a.Arguments)
	}
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimSuffix(t.BaseURL, "/")+path, body)
	if err != nil {
		return &Answer{State: Failed, Code: "intents/bad-operation", Body: []byte(err.Error())}, nil
	}
	for k, vs := range t.Header {
		req.Header[k] = append([]string(nil), vs...)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	kh := t.KeyHeader
	if kh == "" {
		kh = DefaultKeyHeader
	}
	req.Header.Set(kh, a.Key)
	c := t.Client
	if c == nil {
		c = defaultHTTPClient
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, fmt.Errorf("intents: %s: %w", a.Operation, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, MaxAnswerSize+1))
	if err != nil {
		return nil, fmt.Errorf("intents: %s: reading the response: %w", a.Operation, err)
	}
	ans := &Answer{Status: resp.StatusCode, Header: resp.Header, Body: b,
		Replayed: resp.Header.Get("Idempotent-Replayed") == "true", Code: problemType(resp.Header, b)}
	if len(b) > MaxAnswerSize {
		ans.Body, ans.Truncated = b[:MaxAnswerSize], true
	}
	s := resp.StatusCode
	switch {
	case s >= 200 && s < 400:
		ans.State = Succeeded
	case s == http.StatusUnprocessableEntity:
		ans.State = Conflict
	case s == http.StatusGone:
		ans.State = Expired
	case s == http.StatusRequestTimeout, s == http.StatusConflict, s == http.StatusTooEarly,
		s == http.StatusTooManyRequests, s >= 500, s < 200:
		err := fmt.Errorf("intents: %s: %s", a.Operation, resp.Status)
		if step := answerStep(resp.Header, b); step != "" {
			err = &StepError{Step: step, Err: err}
		}
		if ra, ok := parseRetryAfter(resp.Header.Get("Retry-After"), time.Now()); ok {
			return nil, &RetryError{After: ra, Err: err}
		}
		return nil, err
	default:
		ans.State = Failed
	}
	return ans, nil
}

// problemType returns the type of an RFC 9457 problem body (or a Stripe
// error's code), "" for anything else.
func problemType(h http.Header, body []byte) string {
	ct := h.Get("Content-Type")
	if !strings.Contains(ct, "json") {
		return ""
	}
	var p struct {
		Type  string `json:"type"`
		Error struct {
			Code string `json:"code"`
			Type string `json:"type"`
		} `json:"error"`
	}
	if json.Unmarshal(body, &p) != nil {
		return ""
	}
	switch {
	case p.Type != "":
		return p.Type
	case p.Error.Code != "":
		return p.Error.Code
	}
	return p.Error.Type
}

// answerStep returns the step a no-answer response names as uncertain: the
// "step" member of its JSON body (an RFC 9457 problem details body), "" if
// it has none.
func answerStep(h http.Header, body []byte) string {
	if !strings.Contains(h.Get("Content-Type"), "json") {
		return ""
	}
	return StepOf(body)
}

// maxRetryAfter caps the wait a service's Retry-After asks for.
const maxRetryAfter = 24 * time.Hour

// parseRetryAfter reads a Retry-After value: delay-seconds or an HTTP-date,
// capped at maxRetryAfter. Delay-seconds too large to parse (any run of
// digits) is a long wait, capped as the others are, never a retry at once.
func parseRetryAfter(v string, now time.Time) (time.Duration, bool) {
	if v == "" {
		return 0, false
	}
	if n, err := strconv.ParseUint(v, 10, 64); err == nil {
		if n >= uint64(maxRetryAfter/time.Second) {
			return maxRetryAfter, true
		}
		return time.Duration(n) * time.Second, true
	} else if errors.Is(err, strconv.ErrRange) {
		return maxRetryAfter, true // digits only, beyond uint64
	}
	t, err := http.ParseTime(v)
	if err != nil {
		return 0, false
	}
	d := t.Sub(now)
	if d < 0 {
		d = 0
	}
	return min(d, maxRetryAfter), true
}
