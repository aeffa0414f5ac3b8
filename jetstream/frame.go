package jetstream

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"

	"github.com/nats-io/nats.go"

	"github.com/streamwal/streamwal/messages"
)

// The objects this package writes to the object store (archived ranges of
// a stream, flushed segments) hold stored messages in one framing:
//
//	object  = magic "SWAL" version(1 byte) frame*
//	frame   = uvarint(len(body)) body
//	body    = uvarint(id) string(subject) uvarint(keys) (string(key) uvarint(values) string(value)*)* bytes(data)
//	string  = uvarint(len) bytes
//
// A frame is one message as the stream stored it: its MessageID, subject,
// headers (keys in sorted order, so that the same messages always frame to
// the same bytes) and data. MessageIDs grow strictly within an object.

// frameMagic starts every framed object.
const frameMagic = "SWAL"

// frameVersion is the framing's version byte.
const frameVersion = 1

// frameHeaderLen is the length of an object's magic and version.
const frameHeaderLen = len(frameMagic) + 1

// Errors of the frame decoder; every decoding error is a *FrameError that
// matches one of them with errors.Is.
var (
	// ErrFrameTruncated: the object ends inside a frame.
	ErrFrameTruncated = errors.New("framed object truncated")
	// ErrFrameMalformed: a frame does not follow the framing.
	ErrFrameMalformed = errors.New("framed object malformed")
	// ErrFrameVersion: the object is not framed, or in an unknown version.
	ErrFrameVersion = errors.New("framed object of unknown format")
)

// FrameError is a decoding error at a byte offset of a framed object.
type FrameError struct {
	// Offset is where the bad frame (or the object header) starts.
	Offset int
	// Reason says what is wrong.
	Reason string
	// Err is ErrFrameTruncated, ErrFrameMalformed or ErrFrameVersion.
	Err error
}

// Error renders the error.
func (e *FrameError) Error() string {
	return fmt.Sprintf("%v at byte %d: %s", e.Err, e.Offset, e.Reason)
}

// Unwrap returns the sentinel.
func (e *FrameError) Unwrap() error { return e.Err }

// frame is one decoded message of a framed object. Data aliases the
// object's buffer.
type frame struct {
	ID      messages.MessageID
	Subject string
	Header  nats.Header
	Data    []byte
}

// appendFrameHeader starts a framed object.
func appendFrameHeader(dst []byte) []byte {
	return append(append(dst, frameMagic...), frameVersion)
}

// appendFrame appends one frame to dst.
func appendFrame(dst []byte, id messages.MessageID, subject string, hdr nats.Header, data []byte) []byte {
	keys := make([]string, 0, len(hdr))
	size := uvarintLen(uint64(id)) + stringLen(subject) + stringLen(string(data))
	for k, vs := range hdr {
		keys = append(keys, k)
		size += stringLen(k) + uvarintLen(uint64(len(vs)))
		for _, v := range vs {
			size += stringLen(v)
		}
	}
	slices.Sort(keys)
	size += uvarintLen(uint64(len(keys)))
	dst = slices.Grow(dst, uvarintLen(uint64(size))+size)
	dst = binary.AppendUvarint(dst, uint64(size))
	dst = binary.AppendUvarint(dst, uint64(id))
	dst = appendString(dst, subject)
	dst = binary.AppendUvarint(dst, uint64(len(keys)))
	for _, k := range keys {
		dst = appendString(dst, k)
		dst = binary.AppendUvarint(dst, uint64(len(hdr[k])))
		for _, v := range hdr[k] {
			dst = appendString(dst, v)
		}
	}
	return append(binary.AppendUvarint(dst, uint64(len(data))), data...)
}

func appendString(dst []byte, s string) []byte {
	return append(binary.AppendUvarint(dst, uint64(len(s))), s...)
}

func uvarintLen(n uint64) int {
	l := 1
	for ; n >= 0x80; n >>= 7 {
		l++
	}
	return l
}

func stringLen(s string) int { return uvarintLen(uint64(len(s))) + len(s) }

// frameReader decodes the frames of one object in order.
type frameReader struct {
	buf  []byte
	off  int
	last messages.MessageID
}

// newFrameReader checks an object's header and returns a reader of its
// frames.
func newFrameReader(buf []byte) (*frameReader, error) {
	if len(buf) < frameHeaderLen || string(buf[:len(frameMagic)]) != frameMagic {
		return nil, &FrameError{Offset: 0, Reason: "no framing magic", Err: ErrFrameVersion}
	}
	if v := buf[len(frameMagic)]; v != frameVersion {
		return nil, &FrameError{Offset: len(frameMagic), Reason: fmt.Sprintf("version %d", v), Err: ErrFrameVersion}
	}
	return &frameReader{buf: buf, off: frameHeaderLen}, nil
}

// next decodes the next frame that keep accepts (every frame when keep is
// nil), skipping the others after reading only their ID and subject; ok is
// false at the end of the object.
func (r *frameReader) next(keep func(messages.MessageID, string) bool) (frame, bool, error) {
	for r.off < len(r.buf) {
		start := r.off
		d := frameDecoder{buf: r.buf, off: r.off}
		end := d.frameEnd()
		var f frame
		kept := false
		if d.err == nil {
			d.buf = r.buf[:end]
			f.ID, f.Subject = d.address(r.last)
			kept = d.err == nil && (keep == nil || keep(f.ID, f.Subject))
		}
		if kept {
			f = d.rest(f)
			if d.err == nil && d.off != end {
				d.fail(ErrFrameMalformed, "%d bytes left over in the frame", end-d.off)
			}
		}
		if d.err != nil {
			return frame{}, false, d.errorAt(start)
		}
		r.off, r.last = end, f.ID
		if kept {
			return f, true, nil
		}
	}
	return frame{}, false, nil
}

// frameDecoder reads the fields of one frame; the first error sticks.
type frameDecoder struct {
	buf    []byte
	off    int
	err    error
	reason string
}

func (d *frameDecoder) fail(err error, format string, args ...any) {
	if d.err == nil {
		d.err, d.reason = err, fmt.Sprintf(format, args...)
	}
}

func (d *frameDecoder) errorAt(off int) error {
	return &FrameError{Offset: off, Reason: d.reason, Err: d.err}
}

func (d *frameDecoder) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	n, k := binary.Uvarint(d.buf[d.off:])
	switch {
	case k == 0:
		d.fail(ErrFrameTruncated, "varint cut short")
		return 0
	case k < 0:
		d.fail(ErrFrameMalformed, "varint overflows 64 bits")
		return 0
	}
	d.off += k
	return n
}

// count reads a count of items of at least least bytes each.
func (d *frameDecoder) count(what string, least int) int {
	n := d.uvarint()
	if d.err == nil && n > uint64((len(d.buf)-d.off)/least) {
		d.fail(ErrFrameMalformed, "%d %s cannot fit in %d bytes", n, what, len(d.buf)-d.off)
	}
	if d.err != nil {
		return 0
	}
	return int(n)
}

func (d *frameDecoder) bytes() []byte {
	n := d.uvarint()
	if d.err != nil {
		return nil
	}
	if n > uint64(len(d.buf)-d.off) {
		d.fail(ErrFrameTruncated, "field of %d bytes with %d left", n, len(d.buf)-d.off)
		return nil
	}
	b := d.buf[d.off : d.off+int(n) : d.off+int(n)]
	d.off += int(n)
	return b
}

// frameEnd reads a frame's length and returns where it ends.
func (d *frameDecoder) frameEnd() int {
	size := d.uvarint()
	if d.err == nil && size > uint64(len(d.buf)-d.off) {
		d.fail(ErrFrameTruncated, "frame of %d bytes with %d left", size, len(d.buf)-d.off)
	}
	return d.off + int(size)
}

// address reads a frame's ID, which must follow last, and subject. Inside
// a frame whose length fits, running out of bytes is malformed.
func (d *frameDecoder) address(last messages.MessageID) (messages.MessageID, string) {
	id := messages.MessageID(d.uvarint())
	if d.err == nil && id <= last {
		d.fail(ErrFrameMalformed, "message id %d after %d", id, last)
	}
	subject := string(d.bytes())
	if d.err == nil && subject == "" {
		d.fail(ErrFrameMalformed, "empty subject")
	}
	d.truncatedIsMalformed()
	return id, subject
}

// rest reads a frame's headers and data.
func (d *frameDecoder) rest(f frame) frame {
	keys := d.count("header keys", 3)
	if keys > 0 && d.err == nil {
		f.Header = make(nats.Header, keys)
	}
	for range keys {
		k := string(d.bytes())
		vals := make([]string, d.count("header values", 1))
		for i := range vals {
			vals[i] = string(d.bytes())
		}
		if d.err != nil {
			break
		}
		if _, dup := f.Header[k]; dup || k == "" {
			d.fail(ErrFrameMalformed, "header key %q empty or repeated", k)
			break
		}
		f.Header[k] = vals
	}
	f.Data = d.bytes()
	d.truncatedIsMalformed()
	return f
}

// truncatedIsMalformed turns running out of bytes inside a frame into a
// malformed frame.
func (d *frameDecoder) truncatedIsMalformed() {
	if errors.Is(d.err, ErrFrameTruncated) {
		d.err = ErrFrameMalformed
	}
}
