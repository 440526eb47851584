package keyring_test

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"

	"github.com/receiptstore/receipts"
)

// KMS is the part of a key management service's client that a Keyring needs: encryption and
// decryption under a key the service holds and never hands out, bound to an encryption
// context (AWS KMS Encrypt/Decrypt with EncryptionContext, Google Cloud KMS with
// additional authenticated data, Vault's transit engine with its context all have this shape).
type KMS interface {
	Encrypt(ctx context.Context, keyID string, plaintext []byte, encryptionContext map[string]string) ([]byte, error)
	Decrypt(ctx context.Context, keyID string, ciphertext []byte, encryptionContext map[string]string) ([]byte, error)
}

// KMSKeyring is a receipts.Keyring whose key-encryption key lives in a KMS: each scope's data
// key is encrypted by the KMS, bound to the scope's ID, and the store keeps the ciphertext.
// Rotating the key in the KMS (a new key version) and running DB.RewrapKeys wraps every data
// key under the new version, without rewriting any result.
//
// It does not implement receipts.KeyDestroyer: one KMS key wraps every scope, so erasing a
// scope deletes its wrapped data key from the store (and with it every result of the scope),
// but a backup of the store taken before the erasure still holds that wrapped key, which the
// KMS would decrypt. To reach backups, keep a key per scope in the KMS (and schedule its
// deletion in DestroyKey), or use keyring.File.
type KMSKeyring struct {
	KMS   KMS
	KeyID string // the KMS key's ID or alias
}

func (k KMSKeyring) context(scopeID []byte) map[string]string {
	return map[string]string{"receipts-scope": hex.EncodeToString(scopeID)}
}

// WrapKey has the KMS encrypt the data key, bound to the scope.
func (k KMSKeyring) WrapKey(ctx context.Context, scopeID, dataKey []byte) ([]byte, error) {
	return k.KMS.Encrypt(ctx, k.KeyID, dataKey, k.context(scopeID))
}

// UnwrapKey has the KMS decrypt it.
func (k KMSKeyring) UnwrapKey(ctx context.Context, scopeID, wrapped []byte) ([]byte, error) {
	return k.KMS.Decrypt(ctx, k.KeyID, wrapped, k.context(scopeID))
}

// Example_kms opens a store whose results are encrypted under a KMS key. The KMS here is a
// stand-in in this process (localKMS) so that the example runs; a service passes its KMS
// client instead.
func Example_kms() {
	dir, _ := os.MkdirTemp("", "receipts-kms-example")
	defer os.RemoveAll(dir)

	kr := KMSKeyring{KMS: newLocalKMS(), KeyID: "alias/receipts"}
	db, err := receipts.Open(dir, &receipts.Options{Keyring: kr})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer db.Close()

	k := receipts.Key{Scope: "customer-17", ID: "refund-2026-0042"}
	r, err := db.Do(context.Background(), k, []byte("refund 42"), func(ctx context.Context, l *receipts.Lease) ([]byte, error) {
		return []byte("refunded 42.00 EUR to alice@example.com"), nil
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(string(r.Result))
	// Output: refunded 42.00 EUR to alice@example.com
}

// localKMS stands in for a KMS in the example: AES-GCM under a key of its own, bound to the
// encryption context.
type localKMS struct{ aead cipher.AEAD }

func newLocalKMS() *localKMS {
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	b, _ := aes.NewCipher(key)
	aead, _ := cipher.NewGCM(b)
	return &localKMS{aead: aead}
}

func (k *localKMS) Encrypt(_ context.Context, keyID string, plaintext []byte, ec map[string]string) ([]byte, error) {
	nonce := make([]byte, k.aead.NonceSize())
	_, _ = rand.Read(nonce)
	return k.aead.Seal(nonce, nonce, plaintext, []byte(keyID+"|"+ec["receipts-scope"])), nil
}

func (k *localKMS) Decrypt(_ context.Context, keyID string, ciphertext []byte, ec map[string]string) ([]byte, error) {
	n := k.aead.NonceSize()
	if len(ciphertext) < n {
		return nil, errors.New("kms: ciphertext too short")
	}
	return k.aead.Open(nil, ciphertext[:n], ciphertext[n:], []byte(keyID+"|"+ec["receipts-scope"]))
}
