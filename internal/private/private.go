// Package private holds the hooks through which the module's packages reach
// each other's unexported parts without exporting them (Pebble's
// internal/private pattern): the package that owns the part sets the hook in
// its init, and the other calls it.
package private

import "github.com/receiptstore/receipts/driver"

// SetEventKey sets the key of an observe.Event (e, a *observe.Event) and the
// hash key its KeyHash is computed with; set by package observe, called by
// the root when it builds an event. Observers never see the key itself.
var SetEventKey func(e any, hashKey []byte, k driver.Key)
