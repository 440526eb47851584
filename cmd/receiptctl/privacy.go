package main

import (
	"os"

	"github.com/receiptstore/receipts/keyring"
	"github.com/spf13/pflag"
)

// Environment variables receiptctl reads when the matching flag is absent, so that secrets
// stay off command lines (which other users of the machine can read, and shells keep).
const (
	// envKeyring names the key file (--keyring).
	envKeyring = "RECEIPTCTL_KEYRING"
)

// privacyFlags are the flags of encrypted stores and authenticated endpoints.
type privacyFlags struct {
	keyring string // --keyring: a key file (package keyring)
}

func (a *app) privacyFlags(pf *pflag.FlagSet) {
	pf.StringVar(&a.priv.keyring, "keyring", "",
		"the key file (package keyring) of a store whose results are encrypted (Options.Keyring): shows them, and lets erase destroy the scope's key; default $"+envKeyring)
}

// loadPrivacy opens the key file named by --keyring or $RECEIPTCTL_KEYRING, if any.
func (a *app) loadPrivacy() error {
	path := a.priv.keyring
	if path == "" {
		path = os.Getenv(envKeyring)
	}
	if path == "" {
		return nil
	}
	kr, err := keyring.Open(path)
	if err != nil {
		return usagef("--keyring: %v", err)
	}
	a.settings.keyring = kr
	return nil
}
