package main

import (
	"encoding/json"
	"fmt"
	"io"

	"github.com/receiptstore/receipts/receiptadmin"
)

// What stats cannot know offline: the service's counters, its last GC, its
// waiters and its replay cache live in the service's process, not in the
// store. Opened by receiptctl they are receiptctl's own: zeros, and "none".
var offlineUnknown = []string{"counters", "last_gc", "waiters", "replay_cache_entries", "replay_cache_bytes"}

const offlineUnknownWhy = "kept by the service's process, not in the store: run stats with --addr against the service's receiptadmin.Handler"

// writeOfflineStatsJSON prints s without the fields an offline open cannot
// know, and names them in "unknown_offline".
func writeOfflineStatsJSON(w io.Writer, s *receiptadmin.Stats) error {
	b, err := json.Marshal(s)
	if err != nil {
		return err
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		return err
	}
	for _, k := range offlineUnknown {
		delete(m, k)
	}
	m["unknown_offline"] = map[string]any{"fields": offlineUnknown, "why": offlineUnknownWhy}
	return writeJSON(w, m)
}

// printOfflineUnknown is the stats table's line for what an offline open
// cannot know.
func printOfflineUnknown(w io.Writer) {
	fmt.Fprintf(w, "counters, last gc,\tunknown offline: %s\n", offlineUnknownWhy)
	fmt.Fprintf(w, "waiters, replay cache\t\n")
}
