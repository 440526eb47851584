// Package keyring is a receipts.Keyring kept in a local file: the key-encryption key that
// wraps the data key of every scope of a store (receipts.Options.Keyring), with rotation,
// and with erasure that reaches backups (receipts.KeyDestroyer).
//
//	kr, err := keyring.Create("/etc/myservice/receipts.keyring") // once; then keyring.Open
//	db, err := receipts.Open(dir, &receipts.Options{Keyring: kr})
//
// Keep the file outside the store's directory and outside its backups, readable by the
// service alone (it is created with mode 0600). Whoever holds a copy of the store and of
// the file can read the store's results; a copy of the store alone reveals none of them.
//
// # Erasure that reaches backups
//
// The file does not hold one key per scope, yet it can destroy one scope's key: each key
// version is the root of a tree of keys (a puncturable pseudorandom function, after
// Goldreich, Goldwasser and Micali), and a scope's key-encryption key is the leaf its
// ScopeID (128 bits) leads to. DestroyKey (called by receipts.DB.EraseScope) replaces the
// node covering that leaf by the siblings of the path to it: every other leaf can still be
// derived, that one no longer can, by anyone, from this file or from any later copy of it.
// So the wrapped data key a backup or a checkpoint of the store holds for an erased scope
// cannot be unwrapped again. Each erasure adds at most 128 nodes of 49 bytes to the file
// per key version (about 6 KiB); a file that was never used to erase stays under 100 bytes.
// A copy of the file taken before an erasure still derives the erased scope's key: keep the
// file out of backups, or keep its backups no longer than you must keep erased data.
//
// # Rotation
//
// Rotate adds a key version, which wraps every data key from then on; the older versions
// still unwrap what they wrapped. receipts.DB.RewrapKeys then wraps every scope's data key
// anew, without rewriting any result, after which Retire removes the old version.
//
// # Sharing the file
//
// Several processes (nodes of a store on PostgreSQL) may use one file, on shared storage
// or copied to each: every key is derived from the file, so any copy unwraps what any
// other wrapped. Changes (Rotate, DestroyKey, Retire) take an exclusive lock on a file
// beside it (path + ".lock", on platforms with flock) and replace the file atomically; a
// process reads the file again when it has changed. Copies on separate disks must be
// updated after each change (an erasure on one node is complete for backups once every
// copy of the file holds it).
package keyring

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
	"hash/crc32"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/receiptstore/receipts"
)

// Errors. Test for them with errors.Is.
var (
	// ErrDestroyed is returned by UnwrapKey for a scope whose key was destroyed
	// (DestroyKey). It matches receipts.ErrErased too.
	ErrDestroyed = &destroyedError{}
	// ErrUnknownVersion is returned by UnwrapKey for a key wrapped by a version the file
	// no longer holds (Retire), or never held (another file).
	ErrUnknownVersion = errors.New("keyring: the key version that wrapped this key is not in the file")
	// ErrCorrupt marks a key file, or a wrapped key, that does not decode or authenticate.
	ErrCorrupt = errors.New("keyring: corrupt")
)

type destroyedError struct{}

func (*destroyedError) Error() string { return "keyring: the scope's key is destroyed (erased)" }

// Is makes ErrDestroyed match receipts.ErrErased.
func (*destroyedError) Is(target error) bool { return target == receipts.ErrErased }

// File is a Keyring kept in a local file. It implements receipts.Keyring and
// receipts.KeyDestroyer, and is safe for concurrent use.
type File struct {
	path string

	mu    sync.Mutex // protects st, stamp
	st    *state
	stamp fileStamp // of the file st was read from
}

var (
	_ receipts.Keyring      = (*File)(nil)
	_ receipts.KeyDestroyer = (*File)(nil)
)

// fileStamp tells whether the file changed since it was read.
type fileStamp struct {
	size    int64
	modTime time.Time
}

// Create creates a key file at path (mode 0600) with one key version of 32 random bytes. It
// fails if the file exists.
func Create(path string) (*File, error) {
	st := &state{current: 1}
	v := version{id: 1, nodes: map[nodeID][32]byte{}}
	var root [32]byte
	if _, err := rand.Read(root[:]); err != nil {
		return nil, fmt.Errorf("keyring: create %s: %w", path, err)
	}
	v.nodes[nodeID{}] = root
	st.versions = []*version{&v}
	f := &File{path: path}
	unlock, err := lockFile(path)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if _, err := os.Stat(path); err == nil {
		return nil, fmt.Errorf("keyring: create %s: %w", path, os.ErrExist)
	}
	if err := f.write(st); err != nil {
		return nil, err
	}
	return f, nil
}

// Open opens the key file at path.
func Open(path string) (*File, error) {
	f := &File{path: path}
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, err := f.load(); err != nil {
		return nil, err
	}
	return f, nil
}

// Path returns the file's path.
func (f *File) Path() string { return f.path }

// Versions returns the key versions the file holds, oldest first, and the one that wraps.
func (f *File) Versions() (ids []uint32, current uint32, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	st, err := f.load()
	if err != nil {
		return nil, 0, err
	}
	for _, v := range st.versions {
		ids = append(ids, v.id)
	}
	return ids, st.current, nil
}

// WrapKey wraps dataKey for the scope named scopeID with the current version's key for that
// scope: AES-256-GCM, bound to scopeID and the version.
func (f *File) WrapKey(ctx context.Context, scopeID, dataKey []byte) ([]byte, error) {
	if err := checkID(scopeID); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	f.mu.Lock()
	st, err := f.load()
	if err != nil {
		f.mu.Unlock()
		return nil, err
	}
	v := st.version(st.current)
	kek, ok := v.leaf(scopeID)
	f.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("keyring: wrap: %w", ErrDestroyed)
	}
	aead, err := newAEAD(kek[:])
	if err != nil {
		return nil, err
	}
	out := make([]byte, 0, wrapHeaderLen+len(dataKey)+aead.Overhead())
	out = append(out, wrapFormat)
	out = binary.BigEndian.AppendUint32(out, v.id)
	out = out[:wrapHeaderLen]
	if _, err := rand.Read(out[5:wrapHeaderLen]); err != nil {
		return nil, fmt.Errorf("keyring: wrap: %w", err)
	}
	return aead.Seal(out, out[5:wrapHeaderLen], dataKey, wrapAD(out[:5], scopeID)), nil
}

// UnwrapKey returns the data key wrapped for scopeID, with the version that wrapped it. It
// returns ErrDestroyed once the scope's key is destroyed, ErrUnknownVersion for a version
// the file does not hold.
func (f *File) UnwrapKey(ctx context.Context, scopeID, wrapped []byte) ([]byte, error) {
	if err := checkID(scopeID); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if len(wrapped) < wrapHeaderLen+16 || wrapped[0] != wrapFormat {
		return nil, fmt.Errorf("%w: a wrapped key of %d bytes", ErrCorrupt, len(wrapped))
	}
	id := binary.BigEndian.Uint32(wrapped[1:])
	f.mu.Lock()
	st, err := f.load()
	if err != nil {
		f.mu.Unlock()
		return nil, err
	}
	v := st.version(id)
	if v == nil {
		f.mu.Unlock()
		return nil, fmt.Errorf("%w: version %d", ErrUnknownVersion, id)
	}
	kek, ok := v.leaf(scopeID)
	f.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("keyring: unwrap: %w", ErrDestroyed)
	}
	aead, err := newAEAD(kek[:])
	if err != nil {
		return nil, err
	}
	dk, err := aead.Open(nil, wrapped[5:wrapHeaderLen], wrapped[wrapHeaderLen:], wrapAD(wrapped[:5], scopeID))
	if err != nil {
		return nil, fmt.Errorf("%w: the wrapped key does not authenticate for this scope", ErrCorrupt)
	}
	return dk, nil
}

// DestroyKey destroys the keys of the scope named scopeID in every version (see the package
// doc), durably: the file is replaced before it returns. Destroying again does nothing.
func (f *File) DestroyKey(ctx context.Context, scopeID []byte) error {
	if err := checkID(scopeID); err != nil {
		return err
	}
	return f.change(ctx, func(st *state) (bool, error) {
		changed := false
		for _, v := range st.versions {
			changed = v.puncture(scopeID) || changed
		}
		return changed, nil
	})
}

// Rotate adds a key version of 32 random bytes, which wraps every key from now on, and
// returns its number. The older versions still unwrap; receipts.DB.RewrapKeys wraps a
// store's data keys anew, after which Retire removes them.
func (f *File) Rotate(ctx context.Context) (uint32, error) {
	var id uint32
	err := f.change(ctx, func(st *state) (bool, error) {
		var root [32]byte
		if _, err := rand.Read(root[:]); err != nil {
			return false, err
		}
		id = st.versions[len(st.versions)-1].id + 1
		st.versions = append(st.versions, &version{id: id, nodes: map[nodeID][32]byte{{}: root}})
		st.current = id
		return true, nil
	})
	return id, err
}

// Retire removes key version id: keys it wrapped can no longer be unwrapped (run
// receipts.DB.RewrapKeys on every store that uses the file first). The current version
// cannot be retired.
func (f *File) Retire(ctx context.Context, id uint32) error {
	return f.change(ctx, func(st *state) (bool, error) {
		if id == st.current {
			return false, fmt.Errorf("keyring: retire: version %d wraps new keys (Rotate first)", id)
		}
		i := slices.IndexFunc(st.versions, func(v *version) bool { return v.id == id })
		if i < 0 {
			return false, fmt.Errorf("%w: version %d", ErrUnknownVersion, id)
		}
		st.versions = slices.Delete(st.versions, i, i+1)
		return true, nil
	})
}

// change applies fn to the file's state under the file lock and writes it back if fn
// changed it.
func (f *File) change(ctx context.Context, fn func(st *state) (bool, error)) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	unlock, err := lockFile(f.path)
	if err != nil {
		return err
	}
	defer unlock()
	f.mu.Lock()
	defer f.mu.Unlock()
	f.st = nil // read it afresh, under the lock
	st, err := f.load()
	if err != nil {
		return err
	}
	st = st.clone()
	changed, err := fn(st)
	if err != nil || !changed {
		return err
	}
	return f.write(st)
}

// load returns the state, reading the file if it changed since it was read.
// REQUIRES: f.mu held.
func (f *File) load() (*state, error) {
	fi, err := os.Stat(f.path)
	if err != nil {
		return nil, fmt.Errorf("keyring: %w", err)
	}
	stamp := fileStamp{size: fi.Size(), modTime: fi.ModTime()}
	if f.st != nil && stamp == f.stamp {
		return f.st, nil
	}
	b, err := os.ReadFile(f.path)
	if err != nil {
		return nil, fmt.Errorf("keyring: %w", err)
	}
	st, err := decode(b)
	if err != nil {
		return nil, fmt.Errorf("keyring: %s: %w", f.path, err)
	}
	f.st, f.stamp = st, stamp
	return st, nil
}

// write replaces the file by st's encoding, durably: a temporary file beside it, synced,
// renamed over it, and the directory synced.
// REQUIRES: f.mu held, or f not shared yet.
func (f *File) write(st *state) error {
	dir := filepath.Dir(f.path)
	tmp, err := os.CreateTemp(dir, filepath.Base(f.path)+".tmp*")
	if err != nil {
		return fmt.Errorf("keyring: write %s: %w", f.path, err)
	}
	defer os.Remove(tmp.Name()) // gone after the rename
	if err = tmp.Chmod(0o600); err == nil {
		if _, err = tmp.Write(st.encode()); err == nil {
			err = tmp.Sync()
		}
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), f.path)
	}
	if err == nil {
		err = syncDir(dir)
	}
	if err != nil {
		return fmt.Errorf("keyring: write %s: %w", f.path, err)
	}
	f.st = nil // read back at the next use (its stamp)
	return nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}

func checkID(scopeID []byte) error {
	if len(scopeID) != idLen {
		return fmt.Errorf("keyring: a scope ID of %d bytes (want %d: receipts.DB.ScopeID)", len(scopeID), idLen)
	}
	return nil
}

const (
	idLen         = 16
	idBits        = 8 * idLen
	wrapFormat    = 1
	wrapHeaderLen = 1 + 4 + 12 // format, version, nonce
)

func wrapAD(header, scopeID []byte) []byte {
	ad := append([]byte("receipts keyring wrap\x00"), header...)
	return append(ad, scopeID...)
}

func newAEAD(key []byte) (cipher.AEAD, error) {
	b, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(b)
}

// state is the file's contents.
type state struct {
	current  uint32
	versions []*version // by id, ascending
}

func (st *state) version(id uint32) *version {
	for _, v := range st.versions {
		if v.id == id {
			return v
		}
	}
	return nil
}

func (st *state) clone() *state {
	c := &state{current: st.current}
	for _, v := range st.versions {
		c.versions = append(c.versions, &version{id: v.id, nodes: maps.Clone(v.nodes)})
	}
	return c
}

// version is one key version: the nodes of its tree that are kept, which cover every leaf
// but the destroyed ones. A new version has one node, the root.
type version struct {
	id    uint32
	nodes map[nodeID][32]byte
}

// nodeID names a node of the tree: its depth (0 the root, idBits a leaf) and the first depth
// bits of the leaves under it (the rest zero).
type nodeID struct {
	depth  uint8
	prefix [idLen]byte
}

func bit(x []byte, i int) byte { return (x[i/8] >> (7 - i%8)) & 1 }

// prefixOf is x's first depth bits.
func prefixOf(x []byte, depth int) (p [idLen]byte) {
	copy(p[:], x)
	for i := depth; i < idBits; i++ {
		p[i/8] &^= 1 << (7 - i%8)
	}
	return p
}

// child is the key of node's child on side b (0 or 1).
func child(node [32]byte, b byte) (c [32]byte) {
	mac := hmac.New(sha256.New, node[:])
	mac.Write([]byte{'n', b})
	mac.Sum(c[:0])
	return c
}

// cover returns the kept node above leaf x (or x itself), if any.
func (v *version) cover(x []byte) (nodeID, [32]byte, bool) {
	for d := 0; d <= idBits; d++ {
		id := nodeID{depth: uint8(d), prefix: prefixOf(x, d)}
		if k, ok := v.nodes[id]; ok {
			return id, k, true
		}
	}
	return nodeID{}, [32]byte{}, false
}

// leaf is the key of leaf x (the scope's key-encryption key), if not destroyed.
func (v *version) leaf(x []byte) ([32]byte, bool) {
	id, k, ok := v.cover(x)
	if !ok {
		return k, false
	}
	for i := int(id.depth); i < idBits; i++ {
		k = child(k, bit(x, i))
	}
	return k, true
}

// puncture removes the node covering leaf x and keeps the siblings of the path from it to x:
// every other leaf stays derivable, x does not. It reports whether anything changed.
func (v *version) puncture(x []byte) bool {
	id, k, ok := v.cover(x)
	if !ok {
		return false
	}
	delete(v.nodes, id)
	for i := int(id.depth); i < idBits; i++ {
		b := bit(x, i)
		sib := prefixOf(x, i+1)
		sib[i/8] ^= 1 << (7 - i%8)
		v.nodes[nodeID{depth: uint8(i + 1), prefix: sib}] = child(k, 1-b)
		k = child(k, b)
	}
	return true
}

// The file's encoding:
//
//	magic "RCPTKEYS" | format (1) | current version (4) | versions (4)
//	then per version: id (4) | nodes (4) | per node: depth (1) | prefix (16) | key (32)
//	then CRC-32C of everything before it (4)
var fileMagic = []byte("RCPTKEYS")

const (
	fileFormat = 1
	nodeLen    = 1 + idLen + 32
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

func (st *state) encode() []byte {
	b := append([]byte(nil), fileMagic...)
	b = append(b, fileFormat)
	b = binary.BigEndian.AppendUint32(b, st.current)
	b = binary.BigEndian.AppendUint32(b, uint32(len(st.versions)))
	for _, v := range st.versions {
		b = binary.BigEndian.AppendUint32(b, v.id)
		b = binary.BigEndian.AppendUint32(b, uint32(len(v.nodes)))
		ids := make([]nodeID, 0, len(v.nodes))
		for id := range v.nodes {
			ids = append(ids, id)
		}
		slices.SortFunc(ids, func(a, b nodeID) int {
			if a.depth != b.depth {
				return int(a.depth) - int(b.depth)
			}
			return bytes.Compare(a.prefix[:], b.prefix[:])
		})
		for _, id := range ids {
			k := v.nodes[id]
			b = append(b, id.depth)
			b = append(b, id.prefix[:]...)
			b = append(b, k[:]...)
		}
	}
	return binary.BigEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
}

func decode(b []byte) (*state, error) {
	if len(b) < len(fileMagic)+1+8+4 || !bytes.Equal(b[:len(fileMagic)], fileMagic) {
		return nil, fmt.Errorf("%w: not a receipts key file", ErrCorrupt)
	}
	body, sum := b[:len(b)-4], binary.BigEndian.Uint32(b[len(b)-4:])
	if crc32.Checksum(body, castagnoli) != sum {
		return nil, fmt.Errorf("%w: checksum mismatch", ErrCorrupt)
	}
	r := body[len(fileMagic):]
	if r[0] != fileFormat {
		return nil, fmt.Errorf("%w: key file format %d (this version reads %d)", ErrCorrupt, r[0], fileFormat)
	}
	st := &state{current: binary.BigEndian.Uint32(r[1:])}
	n := binary.BigEndian.Uint32(r[5:])
	r = r[9:]
	for range n {
		if len(r) < 8 {
			return nil, fmt.Errorf("%w: truncated", ErrCorrupt)
		}
		v := &version{id: binary.BigEndian.Uint32(r), nodes: map[nodeID][32]byte{}}
		nodes := uint64(binary.BigEndian.Uint32(r[4:]))
		r = r[8:]
		if uint64(len(r)) < nodes*nodeLen {
			return nil, fmt.Errorf("%w: truncated", ErrCorrupt)
		}
		for range nodes {
			var id nodeID
			id.depth = r[0]
			copy(id.prefix[:], r[1:1+idLen])
			if id.depth > idBits || prefixOf(id.prefix[:], int(id.depth)) != id.prefix {
				return nil, fmt.Errorf("%w: a node at depth %d", ErrCorrupt, id.depth)
			}
			var k [32]byte
			copy(k[:], r[1+idLen:nodeLen])
			v.nodes[id] = k
			r = r[nodeLen:]
		}
		st.versions = append(st.versions, v)
	}
	if len(r) != 0 || st.version(st.current) == nil {
		return nil, fmt.Errorf("%w: trailing bytes, or no current version", ErrCorrupt)
	}
	return st, nil
}
