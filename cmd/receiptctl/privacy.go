package main

import (
	"os"

	"github.com/receiptstore/receipts/keyring"
	"github.com/spf13/cobra"
)

// Secrets stay off command lines, which other users of the machine can read (ps,
// /proc/PID/cmdline) and shells keep in their history: each has an environment variable
// that receiptctl reads when its flag is absent, and --pg takes a DSN without a password
// (pgx reads PGPASSWORD, ~/.pgpass or PGPASSFILE, and the other libpq variables, for what
// the DSN leaves out).
const (
	// envKeyring names the key file (--keyring).
	envKeyring = "RECEIPTCTL_KEYRING"
	// envToken holds the bearer token for --addr (--token).
	envToken = "RECEIPTCTL_TOKEN"
	// envPG holds the DSN of a store on PostgreSQL (--pg), used when neither --dir, --pg
	// nor --addr is given.
	envPG = "RECEIPTCTL_PG"
)

// privacyFlags are the flags of encrypted stores and authenticated endpoints.
type privacyFlags struct {
	keyring string // --keyring: a key file (package keyring)
	token   string // --token: a bearer token for --addr
}

func (a *app) privacyFlags(root *cobra.Command) {
	pf := root.PersistentFlags()
	pf.StringVar(&a.priv.keyring, "keyring", "",
		"the key file (package keyring) of a store whose results are encrypted (Options.Keyring): shows them, and lets erase destroy the scope's key; default $"+envKeyring)
	pf.StringVar(&a.priv.token, "token", "",
		"with --addr: a bearer token for a handler served with receiptadmin.Authorize(receiptadmin.BearerToken(...)); prefer $"+envToken+" (a flag shows in the process list)")
}

// loadPrivacy applies the environment's defaults and opens the key file, if any.
func (a *app) loadPrivacy() error {
	if a.priv.token == "" {
		a.priv.token = os.Getenv(envToken)
	}
	if a.dir == "" && a.pg == "" && a.addr == "" {
		a.pg = os.Getenv(envPG)
	}
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

// newClient is the client of --addr, with --token.
func (a *app) newClient() (*client, error) {
	c, err := newClient(a.addr)
	if err != nil {
		return nil, err
	}
	c.token = a.priv.token
	return c, nil
}
