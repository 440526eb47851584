package receipts

import "time"

// Parsers of key IDs that carry their mint time, for Options.KeyTime.

// UUIDv7Time returns the mint time of a UUID version 7 (RFC 9562) in its
// canonical text form, 36 characters of hex digits (either case) and
// hyphens: its first 48 bits are Unix milliseconds. ok is false for
// anything else (another version or variant, braces, a URN prefix).
func UUIDv7Time(id string) (t time.Time, ok bool) {
	if len(id) != 36 || id[8] != '-' || id[13] != '-' || id[18] != '-' || id[23] != '-' {
		return time.Time{}, false
	}
	var ms int64
	for i := range 36 {
		if i == 8 || i == 13 || i == 18 || i == 23 {
			continue
		}
		v, ok := hexVal(id[i])
		if !ok {
			return time.Time{}, false
		}
		switch {
		case i < 13: // 48 bits of milliseconds: 8 + 4 digits
			ms = ms<<4 | int64(v)
		case i == 14 && v != 7: // the version
			return time.Time{}, false
		case i == 19 && v&0xc != 0x8: // the variant: 10xx
			return time.Time{}, false
		}
	}
	return time.UnixMilli(ms), true
}

func hexVal(c byte) (byte, bool) {
	switch {
	case '0' <= c && c <= '9':
		return c - '0', true
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10, true
	case 'A' <= c && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}

// crockford maps a byte to its value in Crockford's base32 (ULIDs; either
// case), or 0xff.
var crockford = func() (t [256]byte) {
	for i := range t {
		t[i] = 0xff
	}
	for i, c := range "0123456789ABCDEFGHJKMNPQRSTVWXYZ" {
		t[c] = byte(i)
		if 'A' <= c && c <= 'Z' {
			t[c+'a'-'A'] = byte(i)
		}
	}
	return t
}()

// ULIDTime returns the mint time of a ULID (github.com/ulid/spec): 26
// characters of Crockford's base32 (either case), the first 10 of them 48
// bits of Unix milliseconds. ok is false for anything else, including a
// ULID whose first character is above '7' (more than 128 bits).
func ULIDTime(id string) (t time.Time, ok bool) {
	if len(id) != 26 {
		return time.Time{}, false
	}
	var ms int64
	for i := range 26 {
		v := crockford[id[i]]
		if v == 0xff || (i == 0 && v > 7) {
			return time.Time{}, false
		}
		if i < 10 {
			ms = ms<<5 | int64(v)
		}
	}
	return time.UnixMilli(ms), true
}
