package intents

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/cockroachdb/pebble/v2"
)

// Defaults of Options.
const (
	// DefaultDeliverFor is how long an action is delivered when its
	// Approval sets no Deadline.
	DefaultDeliverFor = time.Hour
	// DefaultPollInterval is how often Wait and a Dispatcher look for
	// changes made by another process (a journal on PostgreSQL shared by
	// several hosts).
	DefaultPollInterval = time.Second
)

// maxDuration bounds every duration option, so that no time arithmetic
// overflows.
const maxDuration = 10 * 365 * 24 * time.Hour

// Options configures a Journal. The zero value (or nil) is usable.
type Options struct {
	// Now is the clock: approval times, deadlines and the mint time of
	// keys. Default time.Now.
	Now func() time.Time
	// DeliverFor is the deadline of an approval without one, from the
	// approval. Default DefaultDeliverFor.
	DeliverFor time.Duration
	// PollInterval is how often Wait and a Dispatcher re-read the journal
	// for changes another process made; changes made through this Journal
	// wake them at once. Default DefaultPollInterval.
	PollInterval time.Duration
	// Pebble tunes the Pebble store of Open (its FS lets tests use
	// vfs.NewMem). Ignored by other stores.
	Pebble *pebble.Options
	// Logger receives what cannot be returned: an attempt count that could
	// not be written, a delivery that failed. Default slog.Default().
	Logger *slog.Logger
}

// resolve returns a copy of o with defaults filled in, or an error
// wrapping ErrInvalid.
func (o *Options) resolve() (Options, error) {
	var r Options
	if o != nil {
		r = *o
	}
	if r.Now == nil {
		r.Now = time.Now
	}
	if r.DeliverFor == 0 {
		r.DeliverFor = DefaultDeliverFor
	}
	if r.PollInterval == 0 {
		r.PollInterval = DefaultPollInterval
	}
	if r.DeliverFor < 0 || r.DeliverFor > maxDuration {
		return r, bad(fmt.Errorf("intents: Options.DeliverFor %s: want (0, %s]", r.DeliverFor, maxDuration))
	}
	if r.PollInterval < 0 || r.PollInterval > time.Hour {
		return r, bad(fmt.Errorf("intents: Options.PollInterval %s: want (0, 1h]", r.PollInterval))
	}
	if r.Logger == nil {
		r.Logger = slog.Default()
	}
	return r, nil
}
