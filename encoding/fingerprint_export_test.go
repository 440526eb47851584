package encoding

// CanonicalEncoding exposes the bytes Fingerprint hashes to the external
// tests.
var CanonicalEncoding = canonicalEncoding
