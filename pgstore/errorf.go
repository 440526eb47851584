package pgstore

import (
	"fmt"
	"strings"
)

// pgPrefix starts every error message of the engine, once.
const pgPrefix = "pgstore: "

// errorf is fmt.Errorf for the engine's errors, whose format names its layer
// ("pgstore: claim: %w"): each error among args is formatted without its own leading
// "pgstore: ", and without the leading layer words that format's text before its first verb
// says already, so that however many layers wrap one error, the message says "pgstore: "
// once, at its start, and each layer's word once: "pgstore: claim: commit not confirmed by a
// synchronous standby: …", where fmt.Errorf gave "pgstore: claim: pgstore: claim: pgstore:
// commit not confirmed …". errors.Is and errors.As see the same errors as through
// fmt.Errorf's result.
func errorf(format string, args ...any) error {
	err := fmt.Errorf(format, args...)
	words := layerWords(format)
	var trimmed []any
	for i, a := range args {
		e, ok := a.(error)
		if !ok || e == nil {
			continue
		}
		if msg := trimLayers(e.Error(), words); msg != e.Error() {
			if trimmed == nil {
				trimmed = append([]any(nil), args...)
			}
			trimmed[i] = &bareErr{msg: msg, err: e}
		}
	}
	if trimmed == nil {
		return err
	}
	tidy := fmt.Errorf(format, trimmed...)
	msg := tidy.Error()
	if strings.HasPrefix(err.Error(), pgPrefix) && !strings.HasPrefix(msg, pgPrefix) {
		msg = pgPrefix + msg // the prefix came from the first argument, which lost it
	}
	return &tidyErr{msg: msg, err: tidy}
}

// layerWords are the layer words of format's text before its first verb ("pgstore: dotx:
// outcome unknown: %w": dotx, outcome unknown; "pgstore: claim %s: %w": claim).
func layerWords(format string) map[string]bool {
	lead, _, _ := strings.Cut(format, "%")
	words := map[string]bool{}
	segs := strings.Split(lead, ": ")
	for i, s := range segs {
		if i == len(segs)-1 { // not ended by ": ": its first word only ("claim %s")
			if f := strings.Fields(s); len(f) == 1 && strings.HasSuffix(s, " ") {
				words[f[0]] = true
			}
			continue
		}
		if s != "" && s+": " != pgPrefix {
			words[s] = true
		}
	}
	return words
}

// trimLayers is msg without its leading "pgstore: " and the layer words in words that follow
// it.
func trimLayers(msg string, words map[string]bool) string {
	msg = strings.TrimPrefix(msg, pgPrefix)
	for {
		seg, rest, ok := strings.Cut(msg, ": ")
		if !ok || !words[seg] {
			return msg
		}
		msg = strings.TrimPrefix(rest, pgPrefix)
	}
}

// bareErr is err, whose message is msg (errorf: without the layers its wrapper adds).
type bareErr struct {
	msg string
	err error
}

func (b *bareErr) Error() string { return b.msg }
func (b *bareErr) Unwrap() error { return b.err }

// tidyErr is errorf's error: err, with its message msg.
type tidyErr struct {
	msg string
	err error
}

func (t *tidyErr) Error() string { return t.msg }
func (t *tidyErr) Unwrap() error { return t.err }
