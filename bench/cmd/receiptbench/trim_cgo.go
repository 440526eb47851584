//go:build linux && cgo

package main

// #include <malloc.h>
import "C"

// mallocTrim hands the C heap's free memory back to the system (glibc's malloc_trim), so
// that the RSS measured after a store closes no longer counts the block cache it freed.
// Pebble allocates its block cache with C malloc when cgo is on.
func mallocTrim() bool {
	C.malloc_trim(0)
	return true
}

// cHeap reports glibc's heap: bytes handed out by malloc and not freed (in use), and
// bytes malloc holds free in its arenas (free), which may still count in the RSS.
func cHeap() (inUse, free uint64, ok bool) {
	mi := C.mallinfo2()
	return uint64(mi.uordblks) + uint64(mi.hblkhd), uint64(mi.fordblks), true
}
