// Package seal encrypts and decrypts receipts' results at rest (receipts.Options.Keyring):
// each scope's results under a data key of its own (AES-256-GCM), which the engine keeps only
// as the Keyring wrapped it, bound to its key, token and state. The root decides when to seal
// and open; this package holds how, below the root.
package seal

import (
	"bytes"
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"sync"
	"sync/atomic"
	"time"

	"github.com/receiptstore/receipts/driver"
)

// Keyring wraps and unwraps data keys under the application's key-encryption key: the
// method set of receipts.Keyring, whose documentation says what each must do.
type Keyring interface {
	WrapKey(ctx context.Context, scopeID, dataKey []byte) (wrapped []byte, err error)
	UnwrapKey(ctx context.Context, scopeID, wrapped []byte) (dataKey []byte, err error)
}

// maxKeyPartLen is receipts.MaxKeyPartLen: the longest scope or ID.
const maxKeyPartLen = 255

// New returns the sealer for the Keyring kr (nil: results are stored as given, and sealed ones
// cannot be opened) on eng, whose driver.DataKeys and driver.Eraser it uses.
func New(kr Keyring, eng driver.Engine) *Sealer {
	s := &Sealer{kr: kr, secret: eng.Secret()}
	s.keys.Store(&map[string]*dataKey{})
	if kr != nil {
		s.er, _ = eng.(driver.Eraser)
		s.dk, _ = eng.(driver.DataKeys)
	}
	return s
}

// Enabled reports whether results are sealed (a Keyring is set).
func (s *Sealer) Enabled() bool { return s.kr != nil }

// Rewrap wraps every scope's data key anew with the Keyring as it is now, and returns how many
// it rewrapped; a key written or rewrapped concurrently is left as that write left it.
func (s *Sealer) Rewrap(ctx context.Context) (int, error) {
	n := 0
	for k, err := range s.dk.ScanDataKeys(ctx) {
		if err != nil {
			return n, err
		}
		raw, err := s.unwrap(ctx, k.ID, k.Wrapped)
		if err != nil {
			return n, fmt.Errorf("receipts: rewrap: %w", err)
		}
		gen, _, _ := splitWrapped(k.Wrapped)
		w, err := s.wrap(ctx, k.ID, gen, raw)
		if err != nil {
			return n, fmt.Errorf("receipts: rewrap: %w", err)
		}
		ok, err := s.dk.SwapDataKey(ctx, k.ID, k.Wrapped, w)
		if err != nil {
			return n, fmt.Errorf("receipts: rewrap: %w", err)
		}
		if ok {
			n++
		}
	}
	return n, nil
}

// sealMagic starts every sealed result.
var sealMagic = [4]byte{0xc1, 'r', 'S', 1}

const (
	sealTagLen    = 4
	sealNonceLen  = 12
	sealHeaderLen = len(sealMagic) + sealTagLen + sealNonceLen
	// Overhead is what encryption (Options.Keyring) adds to a stored result: the
	// envelope's header and GCM's tag.
	Overhead = sealHeaderLen + 16
	// dataKeyAge bounds how long a data key unwrapped is used to seal before it is read
	// again. (Whether an erasure came after it is checked at every seal: sealKey.)
	dataKeyAge = time.Minute
	// maxDataKeys bounds the data keys kept in memory.
	maxDataKeys = 4096
)

// IsSealed reports whether a stored result is an envelope.
func IsSealed(b []byte) bool { return len(b) >= Overhead && [4]byte(b[:4]) == sealMagic }

// Sealer encrypts and decrypts results for a DB.
type Sealer struct {
	kr     Keyring         // nil: results are stored as given; sealed ones cannot be opened
	dk     driver.DataKeys // the engine's, or nil
	er     driver.Eraser   // the engine's, or nil
	secret []byte

	// keys holds the data keys in memory, by stored scope: a map never changed once
	// published (a replay reads it with one atomic load); mu serializes its replacements.
	keys atomic.Pointer[map[string]*dataKey]
	mu   sync.Mutex
	// forgets counts the keys dropped from memory (forget, under mu): a key read from the
	// engine before one was dropped is not kept (keep).
	forgets atomic.Uint64
}

// dataKey is one scope's data key, unwrapped.
type dataKey struct {
	aead   cipher.AEAD
	tag    [sealTagLen]byte
	gen    uint32    // its generation: the scope's erasures before it was made
	loaded time.Time // when it was read from the engine (monotonic)
}

// errNoDataKey: the scope has no data key stored (none created yet, or erased).
var errNoDataKey = errors.New("no data key")

// seal returns the envelope of plain, recorded as state by the lease with token on the
// stored key k.
func (s *Sealer) Seal(ctx context.Context, k driver.Key, token uint64, state driver.State, plain []byte) ([]byte, error) {
	dk, err := s.key(ctx, k.Scope, true)
	if err != nil {
		return nil, err
	}
	out := make([]byte, sealHeaderLen, sealHeaderLen+len(plain)+16)
	copy(out, sealMagic[:])
	copy(out[4:], dk.tag[:])
	binary.BigEndian.PutUint64(out[8:], token)
	if _, err := rand.Read(out[16:sealHeaderLen]); err != nil {
		return nil, fmt.Errorf("receipts: seal the result: %w", err)
	}
	ad := additionalData(out[:sealHeaderLen], k, token, state)
	out = dk.aead.Seal(out, out[8:sealHeaderLen], plain, *ad)
	adBufs.Put(ad)
	return out, nil
}

// open replaces rec's result by its plaintext if it is sealed.
func (s *Sealer) Open(ctx context.Context, rec *driver.Record) error {
	if !IsSealed(rec.Result) {
		return nil
	}
	plain, err := s.OpenInto(ctx, rec, make([]byte, 0, len(rec.Result)-Overhead))
	if err != nil {
		return err
	}
	rec.Result = plain
	return nil
}

// openInto decrypts rec's sealed result, appending the plaintext to dst.
func (s *Sealer) OpenInto(ctx context.Context, rec *driver.Record, dst []byte) ([]byte, error) {
	if s == nil || s.kr == nil {
		return nil, fmt.Errorf("%w: the result of %s is encrypted, and Options.Keyring is not set", driver.ErrSealed, rec.Key)
	}
	env := rec.Result
	dk, err := s.key(ctx, rec.Key.Scope, false)
	if err == nil && [sealTagLen]byte(env[4:8]) != dk.tag {
		s.Forget(rec.Key.Scope) // another node's newer key, or a stale one here
		dk, err = s.key(ctx, rec.Key.Scope, false)
		if err == nil && [sealTagLen]byte(env[4:8]) != dk.tag {
			return nil, fmt.Errorf("%w: the result of %s was sealed with another data key than its scope's", driver.ErrCorrupt, rec.Key)
		}
	}
	if errors.Is(err, errNoDataKey) {
		return nil, fmt.Errorf("%w: the result of %s is encrypted, and its scope's data key is destroyed", driver.ErrErased, rec.Key)
	}
	if err != nil {
		return nil, err
	}
	ad := additionalData(env[:sealHeaderLen], rec.Key, rec.Token, rec.State)
	plain, err := dk.aead.Open(dst, env[8:sealHeaderLen], env[sealHeaderLen:], *ad)
	adBufs.Put(ad)
	if err != nil {
		return nil, fmt.Errorf("%w: the result of %s does not authenticate under its scope's data key", driver.ErrCorrupt, rec.Key)
	}
	return plain, nil
}

var adBufs = sync.Pool{New: func() any { b := make([]byte, 0, sealHeaderLen+8+1+2+2*maxKeyPartLen); return &b }}

// additionalData is what a result's envelope is bound to: its header, the token, the state
// and the stored key. Put it back in adBufs.
func additionalData(header []byte, k driver.Key, token uint64, state driver.State) *[]byte {
	p := adBufs.Get().(*[]byte)
	b := append((*p)[:0], header...)
	b = binary.BigEndian.AppendUint64(b, token)
	b = append(b, byte(state), byte(len(k.Scope)))
	b = append(b, k.Scope...)
	b = append(b, k.ID...)
	*p = b
	return p
}

// key returns the data key of the stored scope, from memory or the engine; with create (to
// seal), it makes one if the scope has none (errNoDataKey otherwise). To open, any key in
// memory does: the envelope names the key it was sealed with (its tag), and a result that is
// there to open was sealed with a key that was the scope's. To seal, only the key of the
// scope's current generation does (sealKey).
func (s *Sealer) key(ctx context.Context, scope string, create bool) (*dataKey, error) {
	if create {
		return s.sealKey(ctx, scope)
	}
	if dk := (*s.keys.Load())[scope]; dk != nil {
		return dk, nil
	}
	id := driver.ScopeID(s.secret, scope)
	forgets := s.forgets.Load()
	wrapped, found, err := s.dk.DataKey(ctx, id)
	if err != nil {
		return nil, fmt.Errorf("receipts: read a data key: %w", err)
	}
	if !found {
		return nil, errNoDataKey
	}
	raw, err := s.unwrap(ctx, id, wrapped)
	if err != nil {
		return nil, err
	}
	gen, _, _ := splitWrapped(wrapped)
	return s.keep(scope, id, raw, gen, forgets)
}

// sealKeyTries bounds how many times sealKey reads the scope's key again after another node
// changed it under it (an erasure, a new generation).
const sealKeyTries = 4

// sealKey returns the data key to seal a result of the stored scope with: the key of the
// scope's current generation, made if the scope has none.
//
// A key is bound to the erasure state it was made under: its generation (stored with it) is
// the number of the scope's erasures before it was made, and each erasure destroys the
// generation it ends. A key in memory may have been erased since it was loaded, by this node
// or another, and the erasure may have ended since (its end is on the store's clock, not the
// node's): so before sealing with it, sealKey reads the scope's erasure record, and uses the
// key only if no erasure came after it (the erasure count is its generation). The lease that
// seals was claimed before that read, so an erasure after the read makes its commit write
// nothing (driver.ErrLeaseLost): a result is never sealed with a destroyed key.
func (s *Sealer) sealKey(ctx context.Context, scope string) (*dataKey, error) {
	id := driver.ScopeID(s.secret, scope)
	for range sealKeyTries {
		forgets := s.forgets.Load()
		gen, err := s.generation(ctx, id)
		if err != nil {
			return nil, err
		}
		if dk := (*s.keys.Load())[scope]; dk != nil && dk.gen == gen && time.Since(dk.loaded) < dataKeyAge {
			return dk, nil
		}
		wrapped, found, err := s.dk.DataKey(ctx, id)
		if err != nil {
			return nil, fmt.Errorf("receipts: read a data key: %w", err)
		}
		if found {
			g, _, err := splitWrapped(wrapped)
			if err != nil {
				return nil, fmt.Errorf("receipts: the data key of scope %x: %w", id, err)
			}
			switch {
			case g == gen:
				raw, err := s.unwrap(ctx, id, wrapped)
				if err != nil {
					return nil, err
				}
				return s.keep(scope, id, raw, gen, forgets)
			case g > gen: // an erasure and a new key since the read: read again
				continue
			}
			// A key of an erased generation: stored by a call that read the scope's
			// generation before an erasure and wrote after it had ended. It is destroyed
			// in the Keyring: replace it.
		}
		raw := make([]byte, 32)
		if _, err := rand.Read(raw); err != nil {
			return nil, fmt.Errorf("receipts: make a data key: %w", err)
		}
		w, err := s.wrap(ctx, id, gen, raw)
		if err != nil {
			return nil, err
		}
		if found {
			swapped, err := s.dk.SwapDataKey(ctx, id, wrapped, w)
			if err != nil {
				return nil, fmt.Errorf("receipts: replace the erased data key of scope %x: %w", id, err)
			}
			if !swapped { // another node's (or call's) change won: read again
				continue
			}
			return s.keep(scope, id, raw, gen, forgets)
		}
		stored, err := s.dk.PutDataKey(ctx, id, w)
		if err != nil {
			return nil, fmt.Errorf("receipts: store the data key of scope %x: %w", id, err)
		}
		if !bytes.Equal(stored, w) { // another node's (or call's) key won: read again
			continue
		}
		return s.keep(scope, id, raw, gen, forgets)
	}
	return nil, fmt.Errorf("receipts: the data key of scope %x changed %d times while it was read (erasures racing): %w", id, sealKeyTries, driver.ErrLeaseLost)
}

// generation returns the scope's erasure count: the generation of its data key in force.
func (s *Sealer) generation(ctx context.Context, id []byte) (uint32, error) {
	if s.er == nil {
		return 0, nil
	}
	e, found, err := s.er.Erasure(ctx, id)
	if err != nil {
		return 0, fmt.Errorf("receipts: read the erasures of scope %x: %w", id, err)
	}
	if !found {
		return 0, nil
	}
	return e.Count, nil
}

// keep returns the data key raw of generation gen and keeps it in memory, unless a key was
// forgotten (an erasure) since forgets was read: a key read before an erasure is not put back
// after the erasure dropped it.
func (s *Sealer) keep(scope string, id, raw []byte, gen uint32, forgets uint64) (*dataKey, error) {
	dk, err := newDataKey(raw)
	if err != nil {
		return nil, fmt.Errorf("receipts: the data key of scope %x: %w", id, err)
	}
	dk.gen = gen
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.forgets.Load() != forgets {
		return dk, nil
	}
	m := maps.Clone(*s.keys.Load())
	if len(m) >= maxDataKeys {
		for k := range m { // any one
			delete(m, k)
			break
		}
	}
	m[scope] = dk
	s.keys.Store(&m)
	return dk, nil
}

func newDataKey(raw []byte) (*dataKey, error) {
	if len(raw) != 32 {
		return nil, fmt.Errorf("%w: a data key of %d bytes (want 32)", driver.ErrCorrupt, len(raw))
	}
	b, err := aes.NewCipher(raw)
	if err != nil {
		return nil, err
	}
	aead, err := cipher.NewGCM(b)
	if err != nil {
		return nil, err
	}
	dk := &dataKey{aead: aead, loaded: time.Now()}
	mac := hmac.New(sha256.New, raw)
	mac.Write([]byte("receipts data key tag"))
	copy(dk.tag[:], mac.Sum(nil))
	return dk, nil
}

// A data key is stored as generation (4 bytes, big-endian) | what the Keyring wrapped. The
// generation counts the scope's erasures before the key was made: each erasure destroys, in
// a KeyDestroyer, the key of one generation for good, and the scope's next data key (once
// the erasure is no longer in force) is wrapped for the next one (keyringID).

// keyringID is the name a Keyring knows generation gen of the scope named id by: id itself
// for the first, a keyed hash of both after an erasure.
func (s *Sealer) KeyringID(id []byte, gen uint32) []byte {
	if gen == 0 {
		return id
	}
	mac := hmac.New(sha256.New, s.secret)
	mac.Write([]byte("receipts keyring id\x00"))
	mac.Write(id)
	mac.Write(binary.BigEndian.AppendUint32(nil, gen))
	return mac.Sum(nil)[:driver.ScopeIDLen]
}

func (s *Sealer) wrap(ctx context.Context, id []byte, gen uint32, raw []byte) ([]byte, error) {
	w, err := s.kr.WrapKey(ctx, s.KeyringID(id, gen), raw)
	if err != nil {
		return nil, fmt.Errorf("receipts: wrap the data key of scope %x: %w", id, err)
	}
	return append(binary.BigEndian.AppendUint32(make([]byte, 0, 4+len(w)), gen), w...), nil
}

func (s *Sealer) unwrap(ctx context.Context, id, stored []byte) ([]byte, error) {
	gen, w, err := splitWrapped(stored)
	if err != nil {
		return nil, fmt.Errorf("receipts: the data key of scope %x: %w", id, err)
	}
	raw, err := s.kr.UnwrapKey(ctx, s.KeyringID(id, gen), w)
	if err != nil {
		return nil, fmt.Errorf("receipts: unwrap the data key of scope %x: %w", id, err)
	}
	return raw, nil
}

func splitWrapped(stored []byte) (gen uint32, wrapped []byte, err error) {
	if len(stored) < 4 {
		return 0, nil, fmt.Errorf("%w: a stored data key of %d bytes", driver.ErrCorrupt, len(stored))
	}
	return binary.BigEndian.Uint32(stored), stored[4:], nil
}

// forget drops the stored scope's data key from memory.
func (s *Sealer) Forget(scope string) {
	s.mu.Lock()
	m := maps.Clone(*s.keys.Load())
	delete(m, scope)
	s.keys.Store(&m)
	s.forgets.Add(1)
	s.mu.Unlock()
}
