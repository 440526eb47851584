package hostkill_test

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
)

// The run's logs, in its directory. Each line is written with one write(2)
// on a file opened O_APPEND: a SIGKILL loses no line that was written, and
// never leaves half of one (a torn last line is skipped when read).
const (
	effectsLog   = "effects.log"   // service: "intent key effect-id" per effect
	requestsLog  = "requests.log"  // service: "intent key" per request received
	approvalsLog = "approvals.log" // host: "intent key" per Approve that returned
)

// appender appends lines to a log.
type appender struct {
	mu sync.Mutex
	f  *os.File
}

func openLog(dir, name string) (*appender, error) {
	f, err := os.OpenFile(filepath.Join(dir, name), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	return &appender{f: f}, nil
}

func (a *appender) add(fields ...string) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	_, err := a.f.WriteString(strings.Join(fields, " ") + "\n")
	return err
}

// readLog returns the log's complete lines, split into fields.
func readLog(dir, name string) ([][]string, error) {
	f, err := os.Open(filepath.Join(dir, name))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out [][]string
	r := bufio.NewReader(f)
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			break // EOF, or a torn last line
		}
		fields := strings.Fields(line)
		if len(fields) == 0 {
			return nil, fmt.Errorf("%s: empty line", name)
		}
		out = append(out, fields)
	}
	return out, nil
}
