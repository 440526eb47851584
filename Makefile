# The checks CI runs, and the long runs it doesn't.
.PHONY: test race lint ci bench bench-table fuzz soak mutation demo

test:
	go test ./...

race:
	go test -race -count=1 ./...

lint:
	go mod tidy -diff
	cd bench && go mod tidy -diff
	gofmt -l $$(git ls-files '*.go') | (! grep .)
	go vet ./...
	cd bench && go vet ./...
	go run honnef.co/go/tools/cmd/staticcheck@v0.8.2 ./...

ci:
	bash .ci/run

bench:
	cd bench && go test -run '^$$' -bench . -benchmem -count 6 ./... | tee bench.txt

bench-table:
	cd bench && go run ./cmd/receiptbench

fuzz:
	bash scripts/fuzz.sh

soak:
	bash scripts/soak.sh

mutation:
	bash scripts/mutation-check.sh

demo:
	go run ./cmd/receiptctl demo
