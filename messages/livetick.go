package messages

import (
	"strconv"

	"github.com/nats-io/nats.go"

	"github.com/streamwal/streamwal"
)

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
		return nil, invalid("live tick needs a pchannel, a timetick, a covered message and a term")
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
	if v := m.Header.Get(HdrVersion); v != versionText {
		return LiveTick{}, wrapInvalid(ErrMalformed, "live tick version %q", v)
	}
	p, err := streamwal.ParsePChannel(m.Header.Get(HdrPChannel))
	if err != nil {
		return LiveTick{}, wrapInvalid(ErrMalformed, "live tick pchannel: %v", err)
	}
	if m.Subject != c.cluster.LiveTickSubject(p) {
		return LiveTick{}, wrapInvalid(ErrMalformed, "live tick of %s on subject %q", p, m.Subject)
	}
	t := LiveTick{PChannel: p}
	for _, f := range []struct {
		hdr string
		out *uint64
	}{{HdrTimeTick, (*uint64)(&t.TimeTick)}, {HdrCovers, (*uint64)(&t.Covers)}, {HdrTerm, &t.Term}} {
		v, err := strconv.ParseUint(m.Header.Get(f.hdr), 10, 64)
		if err != nil || v == 0 {
			return LiveTick{}, wrapInvalid(ErrMalformed, "live tick header %s=%q", f.hdr, m.Header.Get(f.hdr))
		}
		*f.out = v
	}
	return t, nil
}
