package hostkill_test

import (
	"encoding/json"
	"fmt"
	"os"
	"testing"

	"github.com/receiptstore/receipts/internal/pgtest"
)

// envConfig carries a child's config (JSON) and selects its role.
const envConfig = "RECEIPTS_HOSTKILL_CHILD"

// config is what a child process is told.
type config struct {
	Role   string `json:"role"`   // "service" or "host"
	Dir    string `json:"dir"`    // the run's directory: logs, Pebble directories
	Wire   string `json:"wire"`   // "http" or "mcp"
	Engine string `json:"engine"` // "pebble" or "pg"
	DSN    string `json:"dsn"`    // with "pg"
	// SvcSchema and HostSchema are the schemas of the service's store and
	// the host's journal, with "pg".
	SvcSchema  string `json:"svc_schema"`
	HostSchema string `json:"host_schema"`
	Port       int    `json:"port"` // the service's port on 127.0.0.1
	Gen        int    `json:"gen"`  // the host's run number
	Seed       uint64 `json:"seed"`
	// OffsetHours moves the service's clock ahead, one hour per restart, so
	// that a restarted service finds the dead one's leases run out.
	OffsetHours int  `json:"offset_hours"`
	Approvals   int  `json:"approvals"` // how many actions the host approves
	Final       bool `json:"final"`     // the last host: approve nothing, run until all are done
	OnlyOK      bool `json:"only_ok"`   // every approval is a charge that succeeds
	// HostName is the host's DispatcherOptions.HostName: "" for the
	// default (hostname:pid, a new name per process).
	HostName string `json:"host_name"`
}

// TestMain runs the child roles, or the tests (with the throwaway
// PostgreSQL cluster stopped at the end).
func TestMain(m *testing.M) {
	if v := os.Getenv(envConfig); v != "" {
		var c config
		if err := json.Unmarshal([]byte(v), &c); err != nil {
			fmt.Fprintln(os.Stderr, "hostkill child:", err)
			os.Exit(2)
		}
		var err error
		switch c.Role {
		case "service":
			err = runService(c)
		case "host":
			err = runHost(c)
		default:
			err = fmt.Errorf("unknown role %q", c.Role)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "hostkill child:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	pgtest.Main(m)
}
