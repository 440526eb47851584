package keyring_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/keyring"
)

func scopeID(t *testing.T) []byte {
	t.Helper()
	id := make([]byte, 16)
	if _, err := rand.Read(id); err != nil {
		t.Fatal(err)
	}
	return id
}

func dataKey(t *testing.T) []byte {
	t.Helper()
	return scopeID(t)[:16:16]
}

func create(t *testing.T) (*keyring.File, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "receipts.keyring")
	f, err := keyring.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	return f, path
}

func TestWrapUnwrap(t *testing.T) {
	ctx := context.Background()
	f, path := create(t)
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("key file mode: %v %v", fi.Mode(), err)
	}
	if _, err := keyring.Create(path); !errors.Is(err, os.ErrExist) {
		t.Fatalf("Create over an existing file: %v", err)
	}
	id, other := scopeID(t), scopeID(t)
	dk := dataKey(t)
	w, err := f.WrapKey(ctx, id, dk)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(w, dk) {
		t.Fatal("the wrapped key holds the data key")
	}
	got, err := f.UnwrapKey(ctx, id, w)
	if err != nil || !bytes.Equal(got, dk) {
		t.Fatalf("unwrap: %x %v", got, err)
	}
	if _, err := f.UnwrapKey(ctx, other, w); !errors.Is(err, keyring.ErrCorrupt) {
		t.Fatalf("a wrapped key moved to another scope: %v", err)
	}
	w[len(w)-1] ^= 1
	if _, err := f.UnwrapKey(ctx, id, w); !errors.Is(err, keyring.ErrCorrupt) {
		t.Fatalf("a damaged wrapped key: %v", err)
	}
	if _, err := f.WrapKey(ctx, id[:8], dk); err == nil {
		t.Fatal("a scope ID of 8 bytes was accepted")
	}
	// another process: the same file unwraps what this one wrapped
	g, err := keyring.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	w[len(w)-1] ^= 1
	if got, err := g.UnwrapKey(ctx, id, w); err != nil || !bytes.Equal(got, dk) {
		t.Fatalf("unwrap by another opener: %x %v", got, err)
	}
}

// TestDestroyKey: after DestroyKey, the scope's wrapped key (as a backup holds it) does not
// unwrap, from the file or from any copy made since, and every other scope's still does.
func TestDestroyKey(t *testing.T) {
	ctx := context.Background()
	f, path := create(t)
	const n = 300
	ids, wrapped, keys := make([][]byte, n), make([][]byte, n), make([][]byte, n)
	for i := range n {
		ids[i], keys[i] = scopeID(t), dataKey(t)
		var err error
		if wrapped[i], err = f.WrapKey(ctx, ids[i], keys[i]); err != nil {
			t.Fatal(err)
		}
	}
	before, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	// a sibling that shares every bit but the last with ids[0]
	sib := bytes.Clone(ids[0])
	sib[15] ^= 1
	sibKey := dataKey(t)
	sibWrapped, err := f.WrapKey(ctx, sib, sibKey)
	if err != nil {
		t.Fatal(err)
	}
	other, err := keyring.Open(path) // a second process, sharing the file
	if err != nil {
		t.Fatal(err)
	}
	for _, i := range []int{0, 7} {
		if err := f.DestroyKey(ctx, ids[i]); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.DestroyKey(ctx, ids[0]); err != nil { // again: nothing to do
		t.Fatal(err)
	}
	copyAfter := filepath.Join(t.TempDir(), "copy.keyring")
	after, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(copyAfter, after, 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := keyring.Open(copyAfter)
	if err != nil {
		t.Fatal(err)
	}
	for _, kr := range []*keyring.File{f, other, c} {
		for i := range n {
			got, err := kr.UnwrapKey(ctx, ids[i], wrapped[i])
			if i == 0 || i == 7 {
				if !errors.Is(err, keyring.ErrDestroyed) || !errors.Is(err, receipts.ErrErased) {
					t.Fatalf("%s: scope %d destroyed, unwrap: %v", kr.Path(), i, err)
				}
				continue
			}
			if err != nil || !bytes.Equal(got, keys[i]) {
				t.Fatalf("%s: scope %d: %x %v", kr.Path(), i, got, err)
			}
		}
		if got, err := kr.UnwrapKey(ctx, sib, sibWrapped); err != nil || !bytes.Equal(got, sibKey) {
			t.Fatalf("the destroyed scope's sibling: %x %v", got, err)
		}
		if _, err := kr.WrapKey(ctx, ids[0], keys[0]); !errors.Is(err, keyring.ErrDestroyed) {
			t.Fatalf("wrap for a destroyed scope: %v", err)
		}
	}
	// The file holds at most 128 nodes per destroyed scope, and the copy taken before
	// still unwraps (which is why the file stays out of backups).
	if len(after)-len(before) > 2*128*49 {
		t.Fatalf("the file grew by %d bytes for two erasures", len(after)-len(before))
	}
	old := filepath.Join(t.TempDir(), "before.keyring")
	if err := os.WriteFile(old, before, 0o600); err != nil {
		t.Fatal(err)
	}
	b, err := keyring.Open(old)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := b.UnwrapKey(ctx, ids[0], wrapped[0]); err != nil || !bytes.Equal(got, keys[0]) {
		t.Fatalf("a copy from before the erasure: %v", err)
	}
}

func TestRotateRetire(t *testing.T) {
	ctx := context.Background()
	f, path := create(t)
	id, dk := scopeID(t), dataKey(t)
	w1, err := f.WrapKey(ctx, id, dk)
	if err != nil {
		t.Fatal(err)
	}
	v, err := f.Rotate(ctx)
	if err != nil || v != 2 {
		t.Fatalf("rotate: %d %v", v, err)
	}
	w2, err := f.WrapKey(ctx, id, dk)
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range [][]byte{w1, w2} {
		if got, err := f.UnwrapKey(ctx, id, w); err != nil || !bytes.Equal(got, dk) {
			t.Fatalf("unwrap after rotation: %v", err)
		}
	}
	if err := f.Retire(ctx, 2); err == nil {
		t.Fatal("retired the current version")
	}
	if err := f.Retire(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if _, err := f.UnwrapKey(ctx, id, w1); !errors.Is(err, keyring.ErrUnknownVersion) {
		t.Fatalf("unwrap by a retired version: %v", err)
	}
	g, err := keyring.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	ids, cur, err := g.Versions()
	if err != nil || len(ids) != 1 || ids[0] != 2 || cur != 2 {
		t.Fatalf("versions: %v %d %v", ids, cur, err)
	}
	if got, err := g.UnwrapKey(ctx, id, w2); err != nil || !bytes.Equal(got, dk) {
		t.Fatalf("unwrap after retirement: %v", err)
	}
}

func TestCorruptFile(t *testing.T) {
	_, path := create(t)
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for i := range b {
		c := bytes.Clone(b)
		c[i] ^= 0x40
		p := filepath.Join(t.TempDir(), "k")
		if err := os.WriteFile(p, c, 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := keyring.Open(p); !errors.Is(err, keyring.ErrCorrupt) {
			t.Fatalf("byte %d flipped: %v", i, err)
		}
	}
	p := filepath.Join(t.TempDir(), "k")
	if err := os.WriteFile(p, b[:len(b)-1], 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := keyring.Open(p); !errors.Is(err, keyring.ErrCorrupt) {
		t.Fatalf("truncated: %v", err)
	}
}
