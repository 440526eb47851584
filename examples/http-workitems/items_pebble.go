//go:build !receipts_nopebble

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	"github.com/cockroachdb/pebble/v2"

	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/pebblestore"
)

// newPebbleItems keeps the items in db's Pebble database.
func newPebbleItems(db *receipts.DB) (items, error) {
	return pebbleItems{pebblestore.DB(db)}, nil
}

// pebbleItems keeps the items in the store's Pebble database, under "wi/"
// (receipts keeps to "\x00rcpt").
type pebbleItems struct{ pdb *pebble.DB }

// itemKey is "wi/" + len(caller) + caller + id: callers' items never mix.
func itemKey(who, id string) []byte {
	return fmt.Appendf(nil, "wi/%03d%s%s", len(who), who, id)
}

func (p pebbleItems) put(who string, item WorkItem) (receipts.Effect, error) {
	value, err := json.Marshal(item)
	if err != nil {
		return nil, err
	}
	return receipts.EffectOn(func(_ context.Context, b *pebble.Batch) error {
		return b.Set(itemKey(who, item.ID), value, nil)
	}), nil
}

func (p pebbleItems) get(_ context.Context, who, id string) (*WorkItem, error) {
	v, closer, err := p.pdb.Get(itemKey(who, id))
	if errors.Is(err, pebble.ErrNotFound) {
		return nil, errNoItem
	}
	if err != nil {
		return nil, err
	}
	defer closer.Close()
	var item WorkItem
	if err := json.Unmarshal(v, &item); err != nil {
		return nil, err
	}
	return &item, nil
}

func (p pebbleItems) list(_ context.Context, who string) ([]WorkItem, error) {
	prefix := itemKey(who, "")
	it, err := p.pdb.NewIter(&pebble.IterOptions{LowerBound: prefix, UpperBound: prefixEnd(prefix)})
	if err != nil {
		return nil, err
	}
	defer it.Close()
	items := []WorkItem{}
	for ok := it.First(); ok; ok = it.Next() {
		var item WorkItem
		if err := json.Unmarshal(it.Value(), &item); err != nil {
			return nil, err
		}
		items = append(items, item)
	}
	if err := it.Error(); err != nil {
		return nil, err
	}
	// Oldest first: the keys' order is the ids', which are random.
	slices.SortStableFunc(items, func(a, b WorkItem) int { return a.CreatedAt.Compare(b.CreatedAt) })
	return items, nil
}

func prefixEnd(p []byte) []byte {
	end := bytes.Clone(p)
	for i := len(end) - 1; i >= 0; i-- {
		if end[i] < 0xff {
			end[i]++
			return end[:i+1]
		}
	}
	return nil
}
