package main

import (
	"bytes"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestShowBytes(t *testing.T) {
	for _, c := range []struct {
		in   []byte
		max  int
		want string
	}{
		{nil, 0, "-"},
		{[]byte{}, 0, `""`},
		{[]byte("conf-0001"), 0, "conf-0001"},
		{[]byte("héllo wörld"), 0, "héllo wörld"},
		{[]byte("a\nb"), 0, "base64:YQpi"},                // a table cell is one line
		{[]byte("\x1b[31mred"), 0, "base64:G1szMW1yZWQ="}, // never a terminal escape
		{[]byte{0xff, 0xfe}, 0, "base64://4="},
		{[]byte("abcdefghij"), 5, "abcd…"},
	} {
		require.Equal(t, c.want, showBytes(c.in, c.max), "%q", c.in)
	}
	require.True(t, printable([]byte("a\nb\tc"), true))
	require.False(t, printable([]byte("a\x00b"), true))
	require.False(t, printable([]byte("a\x1bb"), true))
}

func TestShowKeyPart(t *testing.T) {
	require.Equal(t, "acct_7", showKeyPart("acct_7"))
	require.Equal(t, "with space", showKeyPart("with space"))
	require.Equal(t, `"tab\tid"`, showKeyPart("tab\tid"))
	require.Equal(t, `"\xff"`, showKeyPart("\xff"))
	require.Equal(t, `"\x1b[2J"`, showKeyPart("\x1b[2J"))
}

func TestShowSize(t *testing.T) {
	require.Equal(t, "512 B", showSize(512))
	require.Equal(t, "1.5 KiB", showSize(1536))
	require.Equal(t, "3.0 MiB", showSize(3<<20))
}

func TestShellQuote(t *testing.T) {
	require.Equal(t, "/tmp/receipts-demo-1", shellQuote("/tmp/receipts-demo-1"))
	require.Equal(t, "'/tmp/my demo'", shellQuote("/tmp/my demo"))
	require.Equal(t, `'/tmp/it'\''s'`, shellQuote("/tmp/it's"))
}

// TestProgress checks that progress is written only to a terminal.
func TestProgress(t *testing.T) {
	var buf bytes.Buffer
	a := &app{stderr: &buf}
	p := a.newProgress("listed")
	for range 10 {
		p.add()
	}
	p.done()
	require.Empty(t, buf.String())

	r, w, err := os.Pipe() // a pipe is not a terminal either
	require.NoError(t, err)
	defer r.Close()
	defer w.Close()
	require.False(t, isTerminal(w))

	// A terminal gets a counter that it clears at the end.
	p = &progress{w: &buf, label: "listed"}
	p.add()
	p.done()
	require.True(t, strings.HasPrefix(buf.String(), "\rlisted 1 records..."))
	require.True(t, strings.HasSuffix(buf.String(), "\r\033[K"))
}
