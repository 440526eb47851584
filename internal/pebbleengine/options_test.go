package pebbleengine

import (
	"io"
	"log/slog"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/stretchr/testify/require"
)

// The engine's Pebble defaults: an unset LBaseMaxBytes becomes
// DefaultLBaseMaxBytes, a set one is kept, and the caller's options are
// never changed.
func TestPebbleOptionsLBase(t *testing.T) {
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	require.EqualValues(t, DefaultLBaseMaxBytes, pebbleOptions(nil, logger).LBaseMaxBytes)

	mine := &pebble.Options{FS: vfs.NewMem()}
	require.EqualValues(t, DefaultLBaseMaxBytes, pebbleOptions(mine, logger).LBaseMaxBytes)
	require.Zero(t, mine.LBaseMaxBytes, "the caller's options were changed")

	mine.LBaseMaxBytes = 64 << 20
	require.EqualValues(t, 64<<20, pebbleOptions(mine, logger).LBaseMaxBytes)
}
