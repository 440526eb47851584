package seal

import "testing"

// The envelope adds 36 bytes (receipts.Options.Keyring's documentation and
// docs/privacy.md say so): a 20-byte header (magic, key tag, nonce) and
// GCM's 16-byte tag.
func TestOverhead(t *testing.T) {
	if Overhead != 36 || sealHeaderLen != 20 {
		t.Fatalf("Overhead %d, header %d: update the documented 36 bytes", Overhead, sealHeaderLen)
	}
	if IsSealed(make([]byte, Overhead-1)) || !IsSealed(append(sealMagic[:], make([]byte, Overhead)...)) {
		t.Fatal("IsSealed")
	}
}
