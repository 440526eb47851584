package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/receiptstore/receipts/receipthttp"
)

// A stored result is shown for what it is: an HTTP response recorded by
// receipthttp as its status, headers and body; JSON (what receiptmcp stores:
// the tool's result, and what many applications store) indented; other
// printable text as is; anything else as base64.

// resultLines renders a result for get, on as many lines as it takes.
func resultLines(b []byte) string {
	if status, h, body, err := receipthttp.DecodeResponse(b); err == nil {
		var s strings.Builder
		fmt.Fprintf(&s, "HTTP %d %s (a response stored by receipthttp)", status, http.StatusText(status))
		names := make([]string, 0, len(h))
		for name := range h {
			names = append(names, name)
		}
		slices.Sort(names)
		for _, name := range names {
			for _, v := range h[name] {
				fmt.Fprintf(&s, "\n%s: %s", name, v)
			}
		}
		if len(body) > 0 {
			s.WriteString("\n\n" + bodyText(body))
		}
		return s.String()
	}
	if j, ok := indentJSON(b); ok {
		return j
	}
	if len(b) > 0 && printable(b, true) {
		return string(b)
	}
	return showBytes(b, 0)
}

// resultCell renders a result for a table cell: one line of at most max
// runes.
func resultCell(b []byte, max int) string {
	if status, h, body, err := receipthttp.DecodeResponse(b); err == nil {
		s := fmt.Sprintf("HTTP %d", status)
		if ct := h.Get("Content-Type"); ct != "" {
			s += " " + ct
		}
		if len(body) > 0 {
			s += " " + oneLine(body)
		}
		return cut(s, max)
	}
	if json.Valid(b) && len(b) > 0 {
		var c bytes.Buffer
		if json.Compact(&c, b) == nil {
			return cut(c.String(), max)
		}
	}
	return showBytes(b, max)
}

// bodyText is an HTTP body for people: JSON indented, text as is, else
// base64.
func bodyText(b []byte) string {
	if j, ok := indentJSON(b); ok {
		return j
	}
	if printable(b, true) {
		return string(b)
	}
	return showBytes(b, 0)
}

func oneLine(b []byte) string {
	var c bytes.Buffer
	if json.Valid(b) && json.Compact(&c, b) == nil {
		return c.String()
	}
	return showBytes(b, 0)
}

func indentJSON(b []byte) (string, bool) {
	if len(b) == 0 || !json.Valid(b) {
		return "", false
	}
	var out bytes.Buffer
	if json.Indent(&out, b, "", "  ") != nil {
		return "", false
	}
	return out.String(), true
}

// cut shortens s to max runes, the last one an ellipsis (max 0: no limit).
func cut(s string, max int) string {
	if max <= 0 || utf8.RuneCountInString(s) <= max {
		return s
	}
	r := []rune(s)
	return string(r[:max-1]) + "…"
}

// keyCellWidth is the most a scope or an ID takes in a table; --json and
// get show them whole.
const keyCellWidth = 40

// showKeyCell renders a scope or ID for a table cell.
func showKeyCell(s string) string { return cut(showKeyPart(s), keyCellWidth) }
