// Package keys is the receipts store's key layout in Pebble.
//
// Every key the store writes starts with Prefix, a byte string that begins
// with 0x00 so that it sorts before ordinary text keys:
//
//	Prefix "m"                                      meta record
//	Prefix "t"                                      token ceiling
//	Prefix "g"                                      GC floor (first epoch not yet dropped)
//	Prefix "c"                                      the store's clock at the last deletion (or Close)
//	Prefix "r" | epoch (uint64 BE) | len(scope) (1 byte) | scope | id
//	                                                a record
//	Prefix "x" | epoch (uint64 BE) | len(scope) (1 byte) | scope | id
//	                                                a tombstone marker: the key
//	                                                was used (value: the time of
//	                                                its record's last write)
//	Prefix "k" | scope ID (16 bytes)                a scope's data key, wrapped
//	                                                (Options.Keyring)
//	Prefix "e" | scope ID (16 bytes)                a scope's erasure record
//	Prefix "o" | name                               a setting of the root's
//	                                                (driver.Settings)
//
// The scope is length-prefixed, so ("ab","c") and ("a","bc") never collide,
// and the id runs to the end of the key. The epoch is the record's last-write
// time divided by the store's epoch width; it comes first so that a whole
// epoch is one contiguous range for GC's range deletion.
package keys

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"

	"github.com/receiptstore/receipts/internal/mutate"
)

// Prefix is the reserved prefix of all the store's keys.
const Prefix = "\x00rcpt"

const recordsPrefix = Prefix + "r"

const markersPrefix = Prefix + "x"

const (
	dataKeysPrefix = Prefix + "k"
	erasuresPrefix = Prefix + "e"
	settingsPrefix = Prefix + "o"
)

// Fixed keys.
var (
	Meta         = []byte(Prefix + "m")
	TokenCeiling = []byte(Prefix + "t")
	GCFloor      = []byte(Prefix + "g")
	Clock        = []byte(Prefix + "c")
	// StoreStart and StoreEnd bound every key of the store.
	StoreStart = []byte(Prefix)
	StoreEnd   = []byte("\x00rcpu")
	// RecordsStart and RecordsEnd bound every record key.
	RecordsStart = []byte(recordsPrefix)
	RecordsEnd   = []byte(Prefix + "s")
	// MarkersStart and MarkersEnd bound every tombstone marker key.
	MarkersStart = []byte(markersPrefix)
	MarkersEnd   = []byte(Prefix + "y")
	// DataKeysStart and DataKeysEnd bound every data key's key.
	DataKeysStart = []byte(dataKeysPrefix)
	DataKeysEnd   = []byte(Prefix + "l")
	// ErasuresStart and ErasuresEnd bound every erasure record's key.
	ErasuresStart = []byte(erasuresPrefix)
	ErasuresEnd   = []byte(Prefix + "f")
)

// SettingsStart is the prefix of every setting's key.
var SettingsStart = []byte(settingsPrefix)

// Setting is the key of the setting name (driver.Settings).
func Setting(name string) []byte { return append([]byte(settingsPrefix), name...) }

// DataKey is the key of the data key of the scope named id (driver.ScopeID).
func DataKey(id []byte) []byte { return append([]byte(dataKeysPrefix), id...) }

// Erasure is the key of the erasure record of the scope named id.
func Erasure(id []byte) []byte { return append([]byte(erasuresPrefix), id...) }

// ScopeEnd is the first key after every record key of scope in epoch (ScopeStart's
// prefix), and MarkerScopeEnd the same for tombstone markers.
func ScopeEnd(epoch uint64, scope string) []byte { return successor(ScopeStart(epoch, scope)) }

// MarkerScopeEnd: see ScopeEnd.
func MarkerScopeEnd(epoch uint64, scope string) []byte {
	return successor(MarkerScopeStart(epoch, scope))
}

// successor is the first key after every key that starts with prefix, in place.
func successor(prefix []byte) []byte {
	for i := len(prefix) - 1; i >= 0; i-- {
		if prefix[i] != 0xff {
			prefix[i]++
			return prefix[:i+1]
		}
	}
	return nil // every byte 0xff: no key follows (cannot happen: the prefix starts with 0x00)
}

// MaxPartLen is the longest scope or id, in bytes.
const MaxPartLen = 255

// epochOffset is where the epoch starts in a record key.
const epochOffset = len(recordsPrefix)

// recordHeaderLen is the fixed part of a record key.
const recordHeaderLen = epochOffset + 8 + 1

// AppendRecord appends the key of (epoch, scope, id) to dst.
func AppendRecord(dst []byte, epoch uint64, scope, id string) []byte {
	dst = append(dst, recordsPrefix...)
	dst = binary.BigEndian.AppendUint64(dst, epoch)
	if mutate.Name == mutate.NaiveKey {
		dst = append(dst, 0) // broken on purpose: ("ab","c") == ("a","bc")
	} else {
		dst = append(dst, byte(len(scope)))
	}
	dst = append(dst, scope...)
	return append(dst, id...)
}

// AppendMarker appends the tombstone marker key of (epoch, scope, id) to
// dst: laid out as a record key, under its own prefix, so that a whole
// epoch of markers is one contiguous range for GC.
func AppendMarker(dst []byte, epoch uint64, scope, id string) []byte {
	n := len(dst)
	dst = AppendRecord(dst, epoch, scope, id)
	MarkerOf(dst[n:])
	return dst
}

// MarkerOf rewrites a record key in place into the marker key of the same
// epoch and key (and MarkerOf of a marker key back into the record key):
// the two layouts differ only in the prefix's last byte.
func MarkerOf(key []byte) []byte {
	if len(key) > len(Prefix) {
		if key[len(Prefix)] == recordsPrefix[len(Prefix)] {
			key[len(Prefix)] = markersPrefix[len(Prefix)]
		} else if key[len(Prefix)] == markersPrefix[len(Prefix)] {
			key[len(Prefix)] = recordsPrefix[len(Prefix)]
		}
	}
	return key
}

// MarkerEpochStart is the first marker key of an epoch.
func MarkerEpochStart(epoch uint64) []byte {
	return binary.BigEndian.AppendUint64([]byte(markersPrefix), epoch)
}

// MarkerScopeStart is MarkerEpochStart followed by a scope's prefix.
func MarkerScopeStart(epoch uint64, scope string) []byte {
	b := MarkerEpochStart(epoch)
	b = append(b, byte(len(scope)))
	return append(b, scope...)
}

// ParseMarker splits a marker key. The strings are copies.
func ParseMarker(key []byte) (epoch uint64, scope, id string, err error) {
	if len(key) < recordHeaderLen || string(key[:epochOffset]) != markersPrefix {
		return 0, "", "", ErrMalformed
	}
	r := append([]byte(nil), key...)
	return ParseRecord(MarkerOf(r))
}

// MarkerEpoch returns the epoch of a marker key without parsing the rest.
func MarkerEpoch(key []byte) (uint64, bool) {
	if len(key) < epochOffset+8 || string(key[:epochOffset]) != markersPrefix {
		return 0, false
	}
	return binary.BigEndian.Uint64(key[epochOffset:]), true
}

// RecordLen is the length of the key of (scope, id).
func RecordLen(scope, id string) int { return recordHeaderLen + len(scope) + len(id) }

// SetEpoch overwrites the epoch of a record key in place.
func SetEpoch(key []byte, epoch uint64) {
	binary.BigEndian.PutUint64(key[epochOffset:], epoch)
}

// EpochStart is the first key of an epoch.
func EpochStart(epoch uint64) []byte {
	return binary.BigEndian.AppendUint64([]byte(recordsPrefix), epoch)
}

// ScopeStart is the first key of a scope within an epoch, and the prefix
// every record key of that scope in that epoch starts with.
func ScopeStart(epoch uint64, scope string) []byte {
	b := EpochStart(epoch)
	b = append(b, byte(len(scope)))
	return append(b, scope...)
}

// ErrMalformed is returned for a key that is not a record key.
var ErrMalformed = errors.New("keys: malformed record key")

// ParseRecord splits a record key. The strings are copies.
func ParseRecord(key []byte) (epoch uint64, scope, id string, err error) {
	if len(key) < recordHeaderLen || string(key[:epochOffset]) != recordsPrefix {
		return 0, "", "", ErrMalformed
	}
	epoch = binary.BigEndian.Uint64(key[epochOffset:])
	n := int(key[epochOffset+8])
	rest := key[recordHeaderLen:]
	if n == 0 || n > len(rest) || len(rest)-n == 0 || len(rest)-n > MaxPartLen {
		return 0, "", "", ErrMalformed
	}
	return epoch, string(rest[:n]), string(rest[n:]), nil
}

// Epoch returns the epoch of a record key without parsing the rest.
func Epoch(key []byte) (uint64, bool) {
	if len(key) < epochOffset+8 || string(key[:epochOffset]) != recordsPrefix {
		return 0, false
	}
	return binary.BigEndian.Uint64(key[epochOffset:]), true
}

// LockKey is the identity of (scope, id) without the epoch, for the lock
// table: length-prefixed like the record key.
func LockKey(scope, id string) string {
	return string(AppendLockKey(make([]byte, 0, 1+len(scope)+len(id)), scope, id))
}

// AppendLockKey appends LockKey(scope, id) to dst.
func AppendLockKey(dst []byte, scope, id string) []byte {
	if mutate.Name != mutate.NaiveKey {
		dst = append(dst, byte(len(scope)))
	}
	dst = append(dst, scope...)
	return append(dst, id...)
}

// MaxLockKeyLen is the longest lock key.
const MaxLockKeyLen = 1 + 2*MaxPartLen

// MAC appends to dst the HMAC-SHA256, under secret, of the key (scope, id)
// in its lock-key form (AppendLockKey). It is the one definition of the
// bytes behind receipts' external identifiers: Lease.ProviderKey (under the
// store's secret, which users store for good) and Event.KeyHash (under a key
// derived from it). Changing it changes every provider key ever handed out.
func MAC(dst, secret []byte, scope, id string) []byte {
	var lk [MaxLockKeyLen]byte
	mac := hmac.New(sha256.New, secret)
	mac.Write(AppendLockKey(lk[:0], scope, id))
	return mac.Sum(dst)
}

// Hash is an observer's name for the key (scope, id) under hk: the first 12
// bytes of MAC, in hex (24 characters). observe.Event.KeyHash and the
// store's log records ("key#" and the hash) use it.
func Hash(hk []byte, scope, id string) string {
	var sum [sha256.Size]byte
	return hex.EncodeToString(MAC(sum[:0], hk, scope, id)[:12])
}

// stepDomain separates step keys' MACs from MAC's: they are taken under a key derived
// from the secret, so no step key is ever another key's MAC.
const stepDomain = "receipts/step-key/v1"

// StepMAC appends to dst the HMAC-SHA256 of the step name of the key (scope, id): the bytes
// behind receipts' Step.ProviderKey. It is taken under HMAC(secret, stepDomain), over the
// name's length, the name and the key's lock-key form, so two steps, or a step and a key,
// never share it. Changing it changes every step key ever handed out.
func StepMAC(dst, secret []byte, scope, id, name string) []byte {
	dk := hmac.New(sha256.New, secret)
	dk.Write([]byte(stepDomain))
	var kb [sha256.Size]byte
	mac := hmac.New(sha256.New, dk.Sum(kb[:0]))
	var lk [MaxLockKeyLen + binary.MaxVarintLen64]byte
	b := binary.AppendUvarint(lk[:0], uint64(len(name)))
	mac.Write(b)
	mac.Write([]byte(name))
	mac.Write(AppendLockKey(lk[:0], scope, id))
	return mac.Sum(dst)
}
