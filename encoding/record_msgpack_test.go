package encoding

import (
	"bytes"
	"encoding/binary"
	"hash/crc32"

	"github.com/vmihailenco/msgpack/v5"
)

// AppendRecordMsgpack is AppendRecord as it was written before it wrote the
// body itself: through msgpack's Encoder. The tests check that both write
// the same bytes.
func AppendRecordMsgpack(dst []byte, r *Record) []byte {
	var buf bytes.Buffer
	enc := msgpack.NewEncoder(&buf)
	enc.UseCompactInts(true)
	fields := bodyFields
	if len(r.Trace) > 0 {
		fields = traceFields
	}
	if len(r.Journal) > 0 {
		fields = stepFields
	}
	_ = enc.EncodeArrayLen(fields)
	_ = enc.EncodeBytes(r.Fingerprint)
	_ = enc.EncodeBytes(r.Result)
	_ = enc.EncodeUint(uint64(r.Attempts))
	_ = enc.EncodeUint(r.Token)
	_ = enc.EncodeInt(r.CreatedAt)
	_ = enc.EncodeInt(r.UpdatedAt)
	_ = enc.EncodeInt(r.LeaseExpiresAt)
	if fields >= traceFields {
		_ = enc.EncodeBytes(r.Trace)
	}
	if fields == stepFields {
		_ = enc.EncodeBytes(r.Journal)
	}
	start := len(dst)
	dst = append(dst, RecordVersion, byte(r.State))
	dst = append(dst, buf.Bytes()...)
	return binary.BigEndian.AppendUint32(dst, crc32.Checksum(dst[start:], castagnoli))
}

// DecodeRecordMsgpack is DecodeRecordInto (or DecodeRecordShared, if
// shared) with msgpack's decoder only, without the canonical fast path: the
// tests check that both decode every input alike.
func DecodeRecordMsgpack(r *Record, b []byte, shared bool) error {
	state, body, err := recordBody(b)
	if err != nil {
		return err
	}
	return decodeMsgpack(r, state, body, shared)
}
