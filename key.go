package receipts

import (
	"fmt"
	"strconv"

	"github.com/receiptstore/receipts/internal/keys"
)

// Limits on input. Anything larger is rejected with an error wrapping
// ErrInvalidArgument, and nothing is written.
const (
	MaxKeyPartLen     = 255     // bytes in Key.Scope and in Key.ID (each non-empty)
	MaxFingerprintLen = 1024    // bytes in a fingerprint (non-empty)
	MaxResultSize     = 1 << 20 // bytes in a result
)

// MaxKeyPartLen is the key layout's limit: both fail to compile unless equal.
var (
	_ [MaxKeyPartLen - keys.MaxPartLen]struct{}
	_ [keys.MaxPartLen - MaxKeyPartLen]struct{}
)

// Key identifies an operation: Scope is the authenticated caller (account,
// tenant, agent principal), ID the operation key the caller minted when the
// action was approved. Keys of different scopes never see each other. Both
// parts are non-empty and at most MaxKeyPartLen bytes; any bytes are allowed.
// Keep secrets and personal data out of keys: they are stored as given and
// shown by receiptctl.
type Key struct{ Scope, ID string }

// String formats k for messages, quoting each part.
func (k Key) String() string { return strconv.Quote(k.Scope) + "/" + strconv.Quote(k.ID) }

func (k Key) validate() error {
	switch {
	case len(k.Scope) == 0:
		return fmt.Errorf("%w: empty scope", ErrInvalidKey)
	case len(k.ID) == 0:
		return fmt.Errorf("%w: empty id", ErrInvalidKey)
	case len(k.Scope) > MaxKeyPartLen:
		return fmt.Errorf("%w: scope of %d bytes (max %d)", ErrInvalidKey, len(k.Scope), MaxKeyPartLen)
	case len(k.ID) > MaxKeyPartLen:
		return fmt.Errorf("%w: id of %d bytes (max %d)", ErrInvalidKey, len(k.ID), MaxKeyPartLen)
	}
	return nil
}

func validateFingerprint(fp []byte) error {
	switch {
	case len(fp) == 0:
		return fmt.Errorf("%w: nil or empty", ErrInvalidFingerprint)
	case len(fp) > MaxFingerprintLen:
		return fmt.Errorf("%w: %d bytes (max %d)", ErrInvalidFingerprint, len(fp), MaxFingerprintLen)
	}
	return nil
}

func validateResult(result []byte) error {
	if len(result) > MaxResultSize {
		return fmt.Errorf("%w: %d bytes (max %d)", ErrResultTooLarge, len(result), MaxResultSize)
	}
	return nil
}
