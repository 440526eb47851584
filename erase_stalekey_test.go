package receipts_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/keyring"
	"github.com/receiptstore/receipts/pebblestore"
	"github.com/stretchr/testify/require"
)

// slowKeyring is a key file whose UnwrapKey, while held, unwraps and then waits for release
// before it answers: a KMS call whose answer arrives late. It destroys keys as the file does.
type slowKeyring struct {
	*keyring.File
	mu       sync.Mutex
	hold     chan struct{} // non-nil: UnwrapKey waits for it to be closed
	holdWrap chan struct{} // non-nil: WrapKey waits for it to be closed
	entered  chan struct{} // UnwrapKey sends on it once it holds the unwrapped key
}

func (k *slowKeyring) UnwrapKey(ctx context.Context, scopeID, wrapped []byte) ([]byte, error) {
	raw, err := k.File.UnwrapKey(ctx, scopeID, wrapped)
	k.mu.Lock()
	hold, entered := k.hold, k.entered
	k.mu.Unlock()
	if hold != nil {
		entered <- struct{}{}
		<-hold
	}
	return raw, err
}

// WrapKey wraps as the file does, and then, while wraps are held, waits for their release.
func (k *slowKeyring) WrapKey(ctx context.Context, scopeID, dataKey []byte) ([]byte, error) {
	w, err := k.File.WrapKey(ctx, scopeID, dataKey)
	k.mu.Lock()
	hold, entered := k.holdWrap, k.entered
	k.mu.Unlock()
	if hold != nil {
		entered <- struct{}{}
		<-hold
	}
	return w, err
}

// holdWraps makes the next WrapKey calls wait until the returned release is called.
func (k *slowKeyring) holdWraps() (entered <-chan struct{}, release func()) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.holdWrap, k.entered = make(chan struct{}), make(chan struct{}, 16)
	hold := k.holdWrap
	return k.entered, func() {
		k.mu.Lock()
		k.holdWrap = nil
		k.mu.Unlock()
		close(hold)
	}
}

// holdUnwraps makes the next UnwrapKey calls wait until the returned release is called.
func (k *slowKeyring) holdUnwraps() (entered <-chan struct{}, release func()) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.hold, k.entered = make(chan struct{}), make(chan struct{}, 16)
	hold := k.hold
	return k.entered, func() {
		k.mu.Lock()
		k.hold = nil
		k.mu.Unlock()
		close(hold)
	}
}

// TestEraseRacingSlowUnwrap (issue 43, item 1, one Pebble process): a Lookup unwrapping the
// scope's data key through a slow Keyring answers after EraseScope dropped the key from
// memory. Once the erasure has ended, the scope's next result must be sealed with a new data
// key, never with the erased one the Lookup brought back: after a restart it replays (it
// used to be ErrErased, sealed with a key the store no longer holds).
func TestEraseRacingSlowUnwrap(t *testing.T) {
	kr := &slowKeyring{File: newKeyring(t)}
	s := newTestStore(t, func(o *pebblestore.Options) {
		o.Keyring, o.Retention, o.TombstoneWindow = kr, time.Hour, -1
	})
	ok := func(res string) func(context.Context, *receipts.Lease) ([]byte, error) {
		return func(context.Context, *receipts.Lease) ([]byte, error) { return []byte(res), nil }
	}
	_, err := s.db.Do(bg, key("victim", "before"), []byte("fp"), ok("before the erasure"))
	require.NoError(t, err)
	s.reopen() // no data key in memory: the Lookup below unwraps it

	entered, release := kr.holdUnwraps()
	looked := make(chan error, 1)
	go func() {
		_, err := s.db.Lookup(bg, key("victim", "before"))
		looked <- err
	}()
	<-entered // the Lookup holds the unwrapped key; its answer is late
	st, err := s.db.EraseScope(bg, "victim")
	require.NoError(t, err)
	require.True(t, st.KeyDestroyed)
	release()
	<-looked // whatever it answers: it read the receipt before the erasure, or found it gone

	s.clock.Set(st.Until.Add(time.Second)) // the erasure has ended: a claim is a new action
	r, err := s.db.Do(bg, key("victim", "after"), []byte("fp"), ok("after the erasure"))
	require.NoError(t, err)
	require.Equal(t, "after the erasure", string(r.Result))

	s.reopen()
	got, err := s.db.Lookup(bg, key("victim", "after"))
	require.NoError(t, err, "a receipt recorded after the erasure ended, read after a restart")
	require.Equal(t, "after the erasure", string(got.Result))
}

// TestEraseRacingSlowWrap (issue 43, item 1): the first result of a scope makes its data key,
// and the Keyring's WrapKey answers late; meanwhile the scope is erased (its first key
// generation destroyed in the Keyring) and the erasure ends. The late key is then stored as
// the scope's, though the Keyring destroyed its generation: the next results of the scope
// must not be sealed with it (before, each was sealed with it and read as ErrErased after a
// restart), and the one that raced is not recorded (its lease was erased).
func TestEraseRacingSlowWrap(t *testing.T) {
	kr := &slowKeyring{File: newKeyring(t)}
	s := newTestStore(t, func(o *pebblestore.Options) {
		o.Keyring, o.Retention, o.TombstoneWindow = kr, time.Hour, -1
	})
	ok := func(res string) func(context.Context, *receipts.Lease) ([]byte, error) {
		return func(context.Context, *receipts.Lease) ([]byte, error) { return []byte(res), nil }
	}
	entered, release := kr.holdWraps()
	raced := make(chan error, 1)
	go func() {
		_, err := s.db.Do(bg, key("victim", "racing"), []byte("fp"), ok("racing"))
		raced <- err
	}()
	<-entered // the scope's first data key is being wrapped
	st, err := s.db.EraseScope(bg, "victim")
	require.NoError(t, err)
	require.True(t, st.KeyDestroyed)
	s.clock.Set(st.Until.Add(time.Second)) // the erasure has ended
	release()
	require.Error(t, <-raced, "the racing action's lease was erased")

	r, err := s.db.Do(bg, key("victim", "after"), []byte("fp"), ok("after the erasure"))
	require.NoError(t, err)
	require.Equal(t, "after the erasure", string(r.Result))
	s.reopen()
	got, err := s.db.Lookup(bg, key("victim", "after"))
	require.NoError(t, err, "a receipt recorded after the erasure ended, read after a restart")
	require.Equal(t, "after the erasure", string(got.Result))
}
