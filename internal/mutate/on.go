//go:build receipts_mutate

package mutate

import "os"

// Name is the active mutation, from RECEIPTS_MUTATION.
var Name = os.Getenv("RECEIPTS_MUTATION")
