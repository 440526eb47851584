// Package fuzz holds fuzz targets for the receipts public API (see
// api_test.go). It has no code of its own: run it with go test.
//
//	go test ./fuzz                                   # the seed corpus (CI)
//	go test ./fuzz -run '^$' -fuzz FuzzAPI -fuzztime 10m
//	scripts/fuzz.sh 10m                              # every fuzz target
package fuzz
