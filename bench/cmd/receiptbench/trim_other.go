//go:build !(linux && cgo)

package main

// mallocTrim is a no-op without glibc: Pebble's block cache is then Go memory, which
// debug.FreeOSMemory returns.
func mallocTrim() bool { return false }

// cHeap reports nothing without glibc.
func cHeap() (inUse, free uint64, ok bool) { return 0, 0, false }
