package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/receiptadmin"
)

// client reads a running service through the receiptadmin.Handler it
// mounts at base.
type client struct {
	base  *url.URL
	tr    *http.Transport
	hc    *http.Client
	token string // --token: sent as a bearer token (privacy.go)
}

func newClient(addr string) (*client, error) {
	if !strings.Contains(addr, "://") {
		addr = "http://" + addr
	}
	u, err := url.Parse(addr)
	if err != nil {
		return nil, usagef("--addr %q: %v", addr, err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, usagef("--addr %q: want http://HOST:PORT[/PATH] where the service mounts receiptadmin.Handler", addr)
	}
	u.RawQuery, u.Fragment = "", ""
	tr := http.DefaultTransport.(*http.Transport).Clone()
	return &client{base: u, tr: tr, hc: &http.Client{Transport: tr}}, nil
}

func (c *client) close() error {
	c.tr.CloseIdleConnections()
	return nil
}

// call GETs endpoint with q and returns the response of a 200; other
// statuses become errors (404: receipts.ErrNotFound).
func (c *client) call(ctx context.Context, endpoint string, q url.Values) (*http.Response, error) {
	u := *c.base
	u.Path = strings.TrimSuffix(u.Path, "/") + "/" + endpoint
	u.RawPath = ""
	u.RawQuery = q.Encode()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "application/json")
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("cannot reach the service: %w", err)
	}
	if resp.StatusCode == http.StatusOK {
		return resp, nil
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	var e struct {
		Error string `json:"error"`
	}
	msg := strings.TrimSpace(string(body))
	if json.Unmarshal(body, &e) == nil && e.Error != "" {
		msg = e.Error
	} else if len(msg) > 200 {
		msg = msg[:200] + "..."
	}
	switch resp.StatusCode {
	case http.StatusNotFound:
		if e.Error == "" { // not the admin handler's own 404
			return nil, fmt.Errorf("%s: 404 Not Found: is receiptadmin.Handler mounted there? (%s)", u.Redacted(), msg)
		}
		return nil, fmt.Errorf("%w (%s)", receipts.ErrNotFound, msg)
	case http.StatusBadRequest:
		return nil, usagef("the service rejected the request: %s", msg)
	}
	return nil, fmt.Errorf("%s: %s: %s", u.Redacted(), resp.Status, msg)
}

func (c *client) get(ctx context.Context, k receipts.Key) (receiptadmin.Receipt, error) {
	var r receiptadmin.Receipt
	resp, err := c.call(ctx, "get", url.Values{"scope": {k.Scope}, "id": {k.ID}})
	if err != nil {
		return r, err
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		return r, fmt.Errorf("bad answer from the service: %w", err)
	}
	return r, nil
}

// filterQuery is the list endpoint's query for f.
func filterQuery(f receipts.Filter) url.Values {
	q := url.Values{}
	if f.Scope != "" {
		q.Set("scope", f.Scope)
	}
	if f.State != 0 {
		q.Set("state", f.State.String())
	}
	if f.Abandoned {
		q.Set("abandoned", "true")
	}
	if f.Limit > 0 {
		q.Set("limit", strconv.Itoa(f.Limit))
	}
	return q
}

// list streams the service's receiptadmin.List answer.
func (c *client) list(ctx context.Context, f receipts.Filter, each func(receiptadmin.Receipt) error) (now time.Time, problems []string, err error) {
	resp, err := c.call(ctx, "list", filterQuery(f))
	if err != nil {
		return now, nil, err
	}
	defer resp.Body.Close()
	dec := json.NewDecoder(resp.Body)
	bad := func(err error) error { return fmt.Errorf("bad answer from the service: %w", err) }
	if err := expectDelim(dec, '{'); err != nil {
		return now, nil, bad(err)
	}
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return now, problems, bad(err)
		}
		switch t {
		case "now":
			err = dec.Decode(&now)
		case "errors":
			err = dec.Decode(&problems)
		case "receipts":
			if err = expectDelim(dec, '['); err != nil {
				break
			}
			for dec.More() {
				var r receiptadmin.Receipt
				if err := dec.Decode(&r); err != nil {
					return now, problems, bad(err)
				}
				if err := each(r); err != nil {
					return now, problems, err
				}
			}
			err = expectDelim(dec, ']')
		default:
			var skip json.RawMessage
			err = dec.Decode(&skip)
		}
		if err != nil {
			return now, problems, bad(err)
		}
	}
	if err := expectDelim(dec, '}'); err != nil {
		return now, problems, bad(err)
	}
	return now, problems, nil
}

func expectDelim(dec *json.Decoder, d json.Delim) error {
	t, err := dec.Token()
	if err != nil {
		if errors.Is(err, io.EOF) {
			return io.ErrUnexpectedEOF // a cut-off answer
		}
		return err
	}
	if t != d {
		return fmt.Errorf("got %v, want %v", t, d)
	}
	return nil
}

func (c *client) stats(ctx context.Context) (receiptadmin.Stats, error) {
	var s receiptadmin.Stats
	resp, err := c.call(ctx, "stats", nil)
	if err != nil {
		return s, err
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(&s); err != nil {
		return s, fmt.Errorf("bad answer from the service: %w", err)
	}
	return s, nil
}
