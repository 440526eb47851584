package keys

import "testing"

// A stored part is the mark and 22 base64url characters, recognised by
// IsStoredPart; the same input under the same secret gives the same part,
// and the label, the scope (for an ID) and the secret each change it.
func TestHasherParts(t *testing.T) {
	h := NewHasher([]byte("secret"))
	scope := h.Part("scope\x00", "tenant", "", false)
	if len(scope) != StoredPartLen || !IsStoredPart(scope) {
		t.Fatalf("stored scope %q", scope)
	}
	if IsStoredPart("tenant") || IsStoredPart(StoredMark+"not base64 url at all!") {
		t.Fatal("IsStoredPart took a key as given")
	}
	id := h.Part("id\x00", "tenant", "op-1", true)
	if id != h.Part("id\x00", "tenant", "op-1", true) {
		t.Fatal("one ID, two stored forms")
	}
	for name, other := range map[string]string{
		"label":  h.Part("scope\x00", "tenant", "op-1", true),
		"scope":  h.Part("id\x00", "tenant2", "op-1", true),
		"split":  h.Part("id\x00", "tenanto", "p-1", true), // the scope's length is hashed too
		"secret": NewHasher([]byte("other")).Part("id\x00", "tenant", "op-1", true),
	} {
		if other == id {
			t.Errorf("another %s gives the same stored ID", name)
		}
	}
}
