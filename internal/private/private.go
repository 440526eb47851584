// Package private holds the hooks through which the module's packages reach
// each other's unexported parts without exporting them (Pebble's
// internal/private pattern): the package that owns the part sets the hook in
// its init, and the other calls it.
package private
