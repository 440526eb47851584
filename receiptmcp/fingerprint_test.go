package receiptmcp_test

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/receiptstore/receipts/receiptmcp"
)

func TestFingerprint(t *testing.T) {
	fp := func(tool, args string) []byte {
		t.Helper()
		b, err := receiptmcp.Fingerprint(tool, json.RawMessage(args))
		if err != nil {
			t.Fatalf("Fingerprint(%q, %s): %v", tool, args, err)
		}
		return b
	}
	same := [][2]string{
		{`{"a":1,"b":"x"}`, `{"b":"x","a":1}`},
		{`{"a":1}`, `{"a":1.0}`},
		{`{"a":1}`, `{"a":1e0}`},
		{`{"a":1}`, `{"a":10e-1}`},
		{`{"a":-0}`, `{"a":0.0}`},
		{`{"a":0.1}`, `{"a":0.10}`},
		{`{"a":[1,{"c":2.50,"b":true}]}`, ` { "a" : [ 1.0 , { "b" : true , "c" : 2.5 } ] } `},
		{``, `{}`},
		{`null`, `{}`},
		{`{"big":18446744073709551616}`, `{"big":1.8446744073709551616e19}`},
	}
	for _, c := range same {
		if !bytes.Equal(fp("t", c[0]), fp("t", c[1])) {
			t.Errorf("%s and %s differ", c[0], c[1])
		}
	}
	differ := [][2]string{
		{`{"a":1}`, `{"a":"1"}`},
		{`{"a":1}`, `{"a":1.5}`},
		{`{"a":9007199254740993}`, `{"a":9007199254740992}`},
		{`{"a":[1,2]}`, `{"a":[2,1]}`},
		{`{"a":null}`, `{}`},
		{`{"a":true}`, `{"a":1}`},
		{`{"a":{}}`, `{"a":[]}`},
	}
	for _, c := range differ {
		if bytes.Equal(fp("t", c[0]), fp("t", c[1])) {
			t.Errorf("%s and %s match", c[0], c[1])
		}
	}
	if bytes.Equal(fp("t", `{}`), fp("u", `{}`)) {
		t.Error("the tool name is not part of the fingerprint")
	}
	for _, bad := range []string{`{"a":`, `{} {}`, `{"a":1}x`} {
		if _, err := receiptmcp.Fingerprint("t", json.RawMessage(bad)); err == nil {
			t.Errorf("Fingerprint accepted %q", bad)
		}
	}
}
