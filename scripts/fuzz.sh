#!/bin/sh
# Runs every fuzz target of the module for a while each (default 1m).
#
#   scripts/fuzz.sh            # 1 minute per target
#   scripts/fuzz.sh 10m        # 10 minutes per target
#   FUZZ_TARGETS='FuzzAPI' scripts/fuzz.sh 1h
#
# CI runs only the seed corpora (plain `go test ./encoding ./fuzz`). New
# failing inputs land in <pkg>/testdata/fuzz/<Target>/: commit them with the
# fix, so they stay in the seed corpus. Interesting inputs are cached in
# $(go env GOCACHE)/fuzz.
set -eu
cd "$(dirname "$0")/.."
time=${1:-1m}
targets=${FUZZ_TARGETS:-FuzzDecodeRecord FuzzDecodeMeta FuzzDecodeUint64 FuzzRecordRoundTrip FuzzFingerprint FuzzAPI FuzzScrapeHasNoKeys}
for target in $targets; do
	case $target in
	FuzzAPI) pkg=./fuzz ;;
	FuzzScrapeHasNoKeys) pkg=./receiptsprom ;;
	*) pkg=./encoding ;;
	esac
	echo "== $target ($pkg) for $time"
	go test "$pkg" -run '^$' -fuzz "^$target\$" -fuzztime "$time"
done
