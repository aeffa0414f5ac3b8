package wire

import (
	"bytes"
	"encoding"
	"encoding/binary"
	"math/bits"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/messages"
)

// BinaryVersion is the first byte of the binary forms of AppendRequest
// and AppendReply, the version of the format below. It is never '{', the
// first byte of every JSON reply envelope, so that [Call] tells a binary
// reply from an error; a decoder refuses any other version.
//
// After it come unsigned varints (encoding/binary's AppendUvarint) and
// byte strings, each a uvarint length and that many bytes:
//
//	request = version count *message
//	message = subject header data             ; subject, data: byte strings
//	header  = count *(key count *value)       ; keys: strictly increasing bytes
//	reply   = version count *result
//	result  = id timetick last-confirmed txn-id keepalive error
//	error   = 0                               ; no error
//	        / (1+len(code)) code-bytes message reason
//
// Counts are uvarints; key, value and message are byte strings; id,
// timetick, last-confirmed and txn-id are uvarints, keepalive a signed
// varint (AppendVarint) of nanoseconds. An error's code is a string
// (streamwal.Code) whose zero value "" is a code like any other (a non-nil
// error without a code), so the leading uvarint says both whether there is
// an error (0: none) and how long its code is; its reason
// (streamwal.Reason, "" for none) is a byte string. Version 0x02 added
// the reason. The encoding is
// deterministic, header keys sorted; a nil and an empty header, value list
// or data encode alike, and decode as nil.
const BinaryVersion byte = 0x02

var (
	_ encoding.BinaryMarshaler   = AppendRequest{}
	_ encoding.BinaryUnmarshaler = (*AppendRequest)(nil)
	_ encoding.BinaryMarshaler   = AppendReply{}
	_ encoding.BinaryUnmarshaler = (*AppendReply)(nil)
	_ ownedUnmarshaler           = (*AppendRequest)(nil)
)

// ownedUnmarshaler is a request type that can decode without copying from
// a buffer handed over to it (see Decode).
type ownedUnmarshaler interface {
	unmarshalOwned(data []byte) error
}

// Minimum encoded sizes of the counted elements, which bound every count
// by the bytes that remain.
const (
	minMessage = 3 // empty subject, no header keys, no data
	minKey     = 2 // empty key, no values
	minValue   = 1 // empty value
	minResult  = 6 // five zero varints and no error
)

// uvarintLen is the length of x as a uvarint.
func uvarintLen(x uint64) int { return (bits.Len64(x|1) + 6) / 7 }

// varintLen is the length of x as a varint.
func varintLen(x int64) int {
	ux := uint64(x) << 1
	if x < 0 {
		ux = ^ux
	}
	return uvarintLen(ux)
}

// stringLen is the length of a byte string of n bytes.
func stringLen(n int) int { return uvarintLen(uint64(n)) + n }

func appendString(b []byte, s string) []byte {
	return append(binary.AppendUvarint(b, uint64(len(s))), s...)
}

func appendBytes(b []byte, p []byte) []byte {
	return append(binary.AppendUvarint(b, uint64(len(p))), p...)
}

// headerEntry is one header key and its values.
type headerEntry struct {
	key    string
	values []string
}

// MarshalBinary encodes r in its binary form (see BinaryVersion); it never
// fails. The encoding is deterministic: header keys go in sorted order.
func (r AppendRequest) MarshalBinary() ([]byte, error) {
	// One pass for the size and the header entries, one to write them
	// in key order into a buffer of exactly that size. The entries stay in
	// place: sorting their indices moves no pointers.
	keys, most := 0, 0
	for i := range r.Messages {
		keys += len(r.Messages[i].Header)
		most = max(most, len(r.Messages[i].Header))
	}
	entries := make([]headerEntry, 0, keys)
	size := 1 + uvarintLen(uint64(len(r.Messages)))
	for i := range r.Messages {
		m := &r.Messages[i]
		size += stringLen(len(m.Subject)) + uvarintLen(uint64(len(m.Header))) + stringLen(len(m.Data))
		for k, vs := range m.Header {
			entries = append(entries, headerEntry{k, vs})
			size += stringLen(len(k)) + uvarintLen(uint64(len(vs)))
			for _, v := range vs {
				size += stringLen(len(v))
			}
		}
	}
	order := make([]int, most)
	b := make([]byte, 0, size)
	b = append(b, BinaryVersion)
	b = binary.AppendUvarint(b, uint64(len(r.Messages)))
	for i := range r.Messages {
		m := &r.Messages[i]
		b = appendString(b, m.Subject)
		hdr := entries[:len(m.Header)]
		entries = entries[len(m.Header):]
		sorted := order[:len(hdr)]
		for j := range sorted {
			sorted[j] = j
		}
		slices.SortFunc(sorted, func(x, y int) int { return strings.Compare(hdr[x].key, hdr[y].key) })
		b = binary.AppendUvarint(b, uint64(len(hdr)))
		for _, j := range sorted {
			b = appendString(b, hdr[j].key)
			b = binary.AppendUvarint(b, uint64(len(hdr[j].values)))
			for _, v := range hdr[j].values {
				b = appendString(b, v)
			}
		}
		b = appendBytes(b, m.Data)
	}
	return b, nil
}

// UnmarshalBinary decodes the binary form of an AppendRequest into r,
// replacing its messages. Malformed input (truncated, with trailing bytes,
// of another version, with header keys out of order or repeated) is a
// streamwal.ErrInvalidArgument error and leaves r as it was. As
// encoding.BinaryUnmarshaler requires, nothing decoded refers to data:
// the message data are copied (into one allocation). [Decode] avoids the
// copy.
func (r *AppendRequest) UnmarshalBinary(data []byte) error { return r.decode(data, false) }

// unmarshalOwned is UnmarshalBinary without copying the message data: each
// message's Data is a slice of data (its capacity cut at its end, so that
// an append to one does not run into the next), which therefore must not
// change while the request is in use.
func (r *AppendRequest) unmarshalOwned(data []byte) error { return r.decode(data, true) }

// decode validates data in a first pass that also sizes everything, then
// builds the request with one allocation per kind: the messages, the header
// value slices, the strings, the data (unless aliased) and a map per
// message with headers. The strings of a request thus share one
// allocation, which any one of them kept keeps alive; the node keeps none
// past its reply. On error r is left as it was.
func (r *AppendRequest) decode(data []byte, alias bool) error {
	d := decoder{buf: data, what: "append request"}
	if err := d.version(); err != nil {
		return err
	}
	var (
		values  int // header values of all messages
		strs    int // bytes of every subject, key and value
		payload int // bytes of every message's data
	)
	n, err := d.count(minMessage)
	if err != nil {
		return err
	}
	for range n {
		subject, err := d.bytes()
		if err != nil {
			return err
		}
		strs += len(subject)
		keys, err := d.count(minKey)
		if err != nil {
			return err
		}
		var prev []byte
		for j := range keys {
			key, err := d.bytes()
			if err != nil {
				return err
			}
			if j > 0 && bytes.Compare(prev, key) >= 0 {
				return d.fail("header key %q after %q: keys out of order", key, prev)
			}
			prev = key
			strs += len(key)
			nv, err := d.count(minValue)
			if err != nil {
				return err
			}
			values += nv
			for range nv {
				v, err := d.bytes()
				if err != nil {
					return err
				}
				strs += len(v)
			}
		}
		p, err := d.bytes()
		if err != nil {
			return err
		}
		payload += len(p)
	}
	if err := d.end(); err != nil {
		return err
	}

	// The second pass reads what the first one checked: it cannot fail.
	r.Messages = nil
	if n == 0 {
		return nil
	}
	msgs := make([]Message, n)
	vals := make([]string, values)
	var arena strings.Builder
	arena.Grow(strs)
	str := func(p []byte) string {
		if len(p) == 0 {
			return ""
		}
		start := arena.Len()
		arena.Write(p)
		return arena.String()[start:]
	}
	var copied []byte
	if !alias {
		copied = make([]byte, 0, payload)
	}
	t := trusted{buf: data, off: 1}
	t.uvarint() // the count
	for i := range msgs {
		m := &msgs[i]
		m.Subject = str(t.bytes())
		if keys := int(t.uvarint()); keys > 0 {
			m.Header = make(nats.Header, keys)
			for range keys {
				key := str(t.bytes())
				nv := int(t.uvarint())
				var vs []string
				if nv > 0 {
					vs, vals = vals[:nv:nv], vals[nv:]
					for j := range vs {
						vs[j] = str(t.bytes())
					}
				}
				m.Header[key] = vs
			}
		}
		if p := t.bytes(); len(p) > 0 {
			if alias {
				m.Data = p
			} else {
				start := len(copied)
				copied = append(copied, p...)
				m.Data = copied[start:len(copied):len(copied)]
			}
		}
	}
	r.Messages = msgs
	return nil
}

// MarshalBinary encodes r in its binary form (see BinaryVersion); it never
// fails.
func (r AppendReply) MarshalBinary() ([]byte, error) {
	size := 1 + uvarintLen(uint64(len(r.Results)))
	for i := range r.Results {
		res := &r.Results[i]
		size += uvarintLen(uint64(res.ID)) + uvarintLen(uint64(res.TimeTick)) +
			uvarintLen(uint64(res.LastConfirmed)) + uvarintLen(uint64(res.TxnID)) +
			varintLen(int64(res.Keepalive))
		if e := res.Error; e == nil {
			size++
		} else {
			size += stringLen(len(e.Code)+1) - 1 + stringLen(len(e.Message)) + stringLen(len(e.Reason))
		}
	}
	b := make([]byte, 0, size)
	b = append(b, BinaryVersion)
	b = binary.AppendUvarint(b, uint64(len(r.Results)))
	for i := range r.Results {
		res := &r.Results[i]
		b = binary.AppendUvarint(b, uint64(res.ID))
		b = binary.AppendUvarint(b, uint64(res.TimeTick))
		b = binary.AppendUvarint(b, uint64(res.LastConfirmed))
		b = binary.AppendUvarint(b, uint64(res.TxnID))
		b = binary.AppendVarint(b, int64(res.Keepalive))
		if e := res.Error; e == nil {
			b = append(b, 0)
		} else {
			b = binary.AppendUvarint(b, uint64(len(e.Code))+1)
			b = append(b, e.Code...)
			b = appendString(b, e.Message)
			b = appendString(b, string(e.Reason))
		}
	}
	return b, nil
}

// UnmarshalBinary decodes the binary form of an AppendReply into r,
// replacing its results. Malformed input is a streamwal.ErrInvalidArgument
// error and leaves r as it was; nothing decoded refers to data.
func (r *AppendReply) UnmarshalBinary(data []byte) error {
	d := decoder{buf: data, what: "append reply"}
	if err := d.version(); err != nil {
		return err
	}
	n, err := d.count(minResult)
	if err != nil {
		return err
	}
	var results []AppendResult
	if n > 0 {
		results = make([]AppendResult, n)
	}
	for i := range results {
		res := &results[i]
		var v [4]uint64
		for j := range v {
			if v[j], err = d.uvarint(); err != nil {
				return err
			}
		}
		res.ID, res.TimeTick = messages.MessageID(v[0]), messages.TimeTick(v[1])
		res.LastConfirmed, res.TxnID = messages.MessageID(v[2]), messages.TxnID(v[3])
		ka, err := d.varint()
		if err != nil {
			return err
		}
		res.Keepalive = time.Duration(ka)
		tag, err := d.uvarint()
		if err != nil {
			return err
		}
		if tag == 0 {
			continue
		}
		code, err := d.take(tag - 1)
		if err != nil {
			return err
		}
		msg, err := d.bytes()
		if err != nil {
			return err
		}
		reason, err := d.bytes()
		if err != nil {
			return err
		}
		res.Error = &Error{Code: streamwal.Code(code), Message: string(msg), Reason: streamwal.Reason(reason)}
	}
	if err := d.end(); err != nil {
		return err
	}
	r.Results = results
	return nil
}

// decoder reads a binary form, checking every step.
type decoder struct {
	buf  []byte
	off  int
	what string
}

func (d *decoder) fail(format string, args ...any) error {
	return streamwal.Errorf(streamwal.CodeInvalidArgument, "malformed %s at byte %d: "+format,
		append([]any{d.what, d.off}, args...)...)
}

func (d *decoder) version() error {
	if len(d.buf) == 0 {
		return d.fail("empty")
	}
	if v := d.buf[0]; v != BinaryVersion {
		return d.fail("unknown format version %#x", v)
	}
	d.off = 1
	return nil
}

func (d *decoder) uvarint() (uint64, error) {
	x, n := binary.Uvarint(d.buf[d.off:])
	return x, d.skipVarint(n)
}

func (d *decoder) varint() (int64, error) {
	x, n := binary.Varint(d.buf[d.off:])
	return x, d.skipVarint(n)
}

// skipVarint moves past a varint of n bytes, as encoding/binary reported
// it (0: truncated; negative: overflow).
func (d *decoder) skipVarint(n int) error {
	switch {
	case n == 0:
		return d.fail("truncated")
	case n < 0:
		return d.fail("varint overflows 64 bits")
	}
	d.off += n
	return nil
}

// count reads a count of elements of at least least bytes each, which the
// remaining bytes must be able to hold.
func (d *decoder) count(least int) (int, error) {
	c, err := d.uvarint()
	if err != nil {
		return 0, err
	}
	if rest := uint64(len(d.buf) - d.off); c > rest/uint64(least) {
		return 0, d.fail("count %d exceeds the %d bytes left", c, rest)
	}
	return int(c), nil
}

// take reads n bytes.
func (d *decoder) take(n uint64) ([]byte, error) {
	if n > uint64(len(d.buf)-d.off) {
		return nil, d.fail("length %d exceeds the %d bytes left", n, len(d.buf)-d.off)
	}
	p := d.buf[d.off : d.off+int(n) : d.off+int(n)]
	d.off += int(n)
	return p, nil
}

// bytes reads a byte string.
func (d *decoder) bytes() ([]byte, error) {
	n, err := d.uvarint()
	if err != nil {
		return nil, err
	}
	return d.take(n)
}

func (d *decoder) end() error {
	if d.off != len(d.buf) {
		return d.fail("trailing bytes (%d)", len(d.buf)-d.off)
	}
	return nil
}

// trusted reads input a decoder has checked.
type trusted struct {
	buf []byte
	off int
}

func (t *trusted) uvarint() uint64 {
	x, n := binary.Uvarint(t.buf[t.off:])
	t.off += n
	return x
}

// bytes reads a byte string, capacity cut at its end.
func (t *trusted) bytes() []byte {
	n := int(t.uvarint())
	p := t.buf[t.off : t.off+n : t.off+n]
	t.off += n
	return p
}
