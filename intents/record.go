package intents

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"net/http"
	"time"

	"github.com/vmihailenco/msgpack/v5"
)

// recordVersion is the first byte of every stored action.
const recordVersion = 1

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// record is an Action as the Pebble store writes it: msgpack between a
// version byte and a CRC-32C of everything before it.
type record struct {
	Key        string        `msgpack:"k"`
	Target     string        `msgpack:"t"`
	Operation  string        `msgpack:"o"`
	Arguments  []byte        `msgpack:"a"`
	ApprovedBy string        `msgpack:"by"`
	Ref        string        `msgpack:"ref,omitempty"`
	ApprovedAt int64         `msgpack:"at"`
	Deadline   int64         `msgpack:"dl"`
	State      uint8         `msgpack:"s"`
	Attempts   uint32        `msgpack:"n"`
	LastError  string        `msgpack:"err,omitempty"`
	UpdatedAt  int64         `msgpack:"up"`
	Answer     *answerRecord `msgpack:"ans,omitempty"`
	// Holder and LeaseUntil, the delivery lease, came after format 1's
	// first release: a record without them has no lease, and a version
	// before them skips them.
	Holder     string `msgpack:"hd,omitempty"`
	LeaseUntil int64  `msgpack:"lu,omitempty"`
	// UncertainStep came after them, the same way: a record without it
	// names no step.
	UncertainStep string `msgpack:"us,omitempty"`
}

func nanos(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

func fromNanos(n int64) time.Time {
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n)
}

// answerRecord is an Answer in a record.
type answerRecord struct {
	State     uint8       `msgpack:"s"`
	Status    int         `msgpack:"st,omitempty"`
	Header    http.Header `msgpack:"h,omitempty"`
	Body      []byte      `msgpack:"b,omitempty"`
	Truncated bool        `msgpack:"tr,omitempty"`
	Code      string      `msgpack:"c,omitempty"`
	Replayed  bool        `msgpack:"r,omitempty"`
	SettledBy string      `msgpack:"by,omitempty"`
	At        int64       `msgpack:"at"`
}

// encodeAction returns the stored form of a.
func encodeAction(a *Action) ([]byte, error) {
	r := record{
		Key: a.Key, Target: a.Target, Operation: a.Operation, Arguments: a.Arguments,
		ApprovedBy: a.ApprovedBy, Ref: a.Ref, ApprovedAt: nanos(a.ApprovedAt), Deadline: nanos(a.Deadline),
		State: uint8(a.State), Attempts: a.Attempts, LastError: a.LastError, UpdatedAt: nanos(a.UpdatedAt),
		Holder: a.Holder, LeaseUntil: nanos(a.LeaseUntil), UncertainStep: a.UncertainStep,
	}
	if ans := a.Answer; ans != nil {
		r.Answer = &answerRecord{uint8(ans.State), ans.Status, ans.Header, ans.Body, ans.Truncated, ans.Code, ans.Replayed, ans.SettledBy, nanos(ans.At)}
	}
	body, err := msgpack.Marshal(&r)
	if err != nil {
		return nil, fmt.Errorf("intents: encode action %s: %w", a.Key, err)
	}
	out := make([]byte, 0, 1+len(body)+4)
	out = append(out, recordVersion)
	out = append(out, body...)
	return binary.BigEndian.AppendUint32(out, crc32.Checksum(out, castagnoli)), nil
}

// decodeAction reads what encodeAction wrote. Damaged bytes give an error
// wrapping ErrCorrupt, never a panic. The checksum is checked before
// msgpack sees a declared length.
func decodeAction(b []byte) (*Action, error) {
	if len(b) < 1+4 {
		return nil, fmt.Errorf("%w: record of %d bytes", ErrCorrupt, len(b))
	}
	n := len(b) - 4
	if crc32.Checksum(b[:n], castagnoli) != binary.BigEndian.Uint32(b[n:]) {
		return nil, fmt.Errorf("%w: checksum mismatch", ErrCorrupt)
	}
	if b[0] != recordVersion {
		return nil, fmt.Errorf("%w: record version %d", ErrUnknownFormat, b[0])
	}
	var r record
	if err := msgpack.Unmarshal(b[1:n], &r); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	a := &Action{
		Key: r.Key, Target: r.Target, Operation: r.Operation, Arguments: r.Arguments,
		ApprovedBy: r.ApprovedBy, Ref: r.Ref, ApprovedAt: fromNanos(r.ApprovedAt), Deadline: fromNanos(r.Deadline),
		State: State(r.State), Attempts: r.Attempts, LastError: r.LastError, UpdatedAt: fromNanos(r.UpdatedAt),
		Holder: r.Holder, LeaseUntil: fromNanos(r.LeaseUntil), UncertainStep: r.UncertainStep,
	}
	if a.State < Approved || a.State > Uncertain || a.Key == "" {
		return nil, fmt.Errorf("%w: action %q in state %d", ErrCorrupt, a.Key, r.State)
	}
	if ans := r.Answer; ans != nil {
		a.Answer = &Answer{State: State(ans.State), Status: ans.Status, Header: ans.Header, Body: ans.Body,
			Truncated: ans.Truncated, Code: ans.Code, Replayed: ans.Replayed, SettledBy: ans.SettledBy, At: fromNanos(ans.At)}
	}
	return a, nil
}
