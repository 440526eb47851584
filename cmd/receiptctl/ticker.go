package main

import (
	"fmt"
	"io"
	"sync/atomic"
	"time"
)

// ticker shows that a long call (verify, gc) is running: its label, the
// records done so far if the call reports them (receipts.WithProgress), and
// the time taken, on stderr when stderr is a terminal, five times a second.
type ticker struct {
	w     io.Writer // nil: off
	label string
	start time.Time
	n     atomic.Int64 // records done; -1: not reported
	stop  chan struct{}
	done  chan struct{}
}

func (a *app) startTicker(label string) *ticker {
	var w io.Writer
	if isTerminal(a.stderr) {
		w = a.stderr
	}
	return startTicker(w, label, 200*time.Millisecond)
}

func startTicker(w io.Writer, label string, every time.Duration) *ticker {
	t := &ticker{w: w, label: label, start: time.Now()}
	t.n.Store(-1)
	if w == nil {
		return t
	}
	t.stop, t.done = make(chan struct{}), make(chan struct{})
	go func() {
		defer close(t.done)
		tk := time.NewTicker(every)
		defer tk.Stop()
		for {
			select {
			case <-t.stop:
				fmt.Fprint(w, "\r\033[K")
				return
			case <-tk.C:
				fmt.Fprint(w, t.line())
			}
		}
	}()
	return t
}

// line is the progress line, starting with a carriage return.
func (t *ticker) line() string {
	el := time.Since(t.start).Round(100 * time.Millisecond)
	if n := t.n.Load(); n >= 0 {
		return fmt.Sprintf("\r%s: %d records, %s...", t.label, n, el)
	}
	return fmt.Sprintf("\r%s: %s...", t.label, el)
}

// set records how many records are done (a receipts.WithProgress callback).
func (t *ticker) set(n int) { t.n.Store(int64(n)) }

// end stops the ticker and clears its line.
func (t *ticker) end() {
	if t.stop != nil {
		close(t.stop)
		<-t.done
		t.stop = nil
	}
}
