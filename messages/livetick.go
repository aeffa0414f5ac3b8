package messages

import (
	"errors"
	"strconv"

	"github.com/nats-io/nats.go"

	"github.com/streamwal/streamwal"
)

// errZero refuses a zero where a live tick needs a positive number.
var errZero = errors.New("zero")

// HdrCovers is the header of a live tick naming the MessageID it covers.
const HdrCovers = "Wal-Covers"

// LiveTick is a TimeTick published on core NATS instead of being
// persisted: when nothing was appended since the last persisted TimeTick
// message, the WAL still tells live readers that time moved on. It
// promises that no message after Covers (the PChannel-level message that
// was then the stream's last) will have a TimeTick at or below TimeTick,
// so a reader may advance its watermark to TimeTick once it has read
// Covers.
type LiveTick struct {
	PChannel streamwal.PChannel
	TimeTick TimeTick
	Covers   MessageID
	Term     uint64
}

// EncodeLiveTick renders a live tick as a core NATS message on the
// PChannel's live-tick subject.
func (c *Codec) EncodeLiveTick(t LiveTick) (*nats.Msg, error) {
	if t.PChannel.IsZero() || t.TimeTick == 0 || t.Covers == 0 || t.Term == 0 {
		return nil, wrapInvalid(ErrMalformed, "live tick needs a pchannel, a timetick, a covered message and a term")
	}
	m := nats.NewMsg(c.cluster.LiveTickSubject(t.PChannel))
	m.Header.Set(HdrVersion, versionText)
	m.Header.Set(HdrPChannel, t.PChannel.String())
	m.Header.Set(HdrTimeTick, strconv.FormatUint(uint64(t.TimeTick), 10))
	m.Header.Set(HdrCovers, strconv.FormatUint(uint64(t.Covers), 10))
	m.Header.Set(HdrTerm, strconv.FormatUint(t.Term, 10))
	return m, nil
}

// DecodeLiveTick parses a live tick; anything malformed is an
// invalid-argument error wrapping ErrMalformed.
func (c *Codec) DecodeLiveTick(m *nats.Msg) (LiveTick, error) {
	if m == nil || m.Header == nil {
		return LiveTick{}, wrapInvalid(ErrMalformed, "live tick without headers")
	}
	r := headerReader{hdr: m.Header}
	if v := r.value(HdrVersion); v != versionText {
		r.fail(HdrVersion, v, "unsupported version")
	}
	p, err := streamwal.ParsePChannel(r.value(HdrPChannel))
	if r.err == nil && err != nil {
		r.fail(HdrPChannel, m.Header.Get(HdrPChannel), err)
	}
	t := LiveTick{PChannel: p}
	for _, f := range []struct {
		hdr string
		out *uint64
	}{{HdrTimeTick, (*uint64)(&t.TimeTick)}, {HdrCovers, (*uint64)(&t.Covers)}, {HdrTerm, &t.Term}} {
		v := r.value(f.hdr)
		n, err := parseUint(v)
		if err == nil && n == 0 {
			err = errZero
		}
		if err != nil {
			r.fail(f.hdr, v, err)
		}
		*f.out = n
	}
	if r.err != nil {
		return LiveTick{}, r.err
	}
	if m.Subject != c.cluster.LiveTickSubject(p) {
		return LiveTick{}, wrapInvalid(ErrMalformed, "live tick of %s on subject %q", p, m.Subject)
	}
	return t, nil
}
