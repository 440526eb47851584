//go:build !receipts_mutate

package mutate

// Name is the active mutation: none in normal builds.
const Name = ""
