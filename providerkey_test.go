package receipts_test

import (
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestProviderKeyFormat pins what the README and Lease.ProviderKey's doc
// promise: "rk_" and the unpadded base64url of a 32-byte HMAC, 46
// characters in all, for short and long keys alike.
func TestProviderKeyFormat(t *testing.T) {
	s := newTestStore(t, nil)
	format := regexp.MustCompile(`^rk_[A-Za-z0-9_-]{43}$`)
	for _, k := range []struct{ scope, id string }{
		{"a", "1"},
		{strings.Repeat("s", 200), strings.Repeat("i", 200)},
	} {
		l, _, err := s.db.Claim(bg, key(k.scope, k.id), []byte("fp"))
		require.NoError(t, err)
		pk := l.ProviderKey()
		require.Len(t, pk, 46)
		require.Regexp(t, format, pk)
		require.NoError(t, l.Release(bg))
	}
}
