package messages_test

import (
	"math"
	"strconv"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/messages"
)

func validLiveTick(t testing.TB) messages.LiveTick {
	return messages.LiveTick{PChannel: pch(t, 3), TimeTick: mustTick(t, 1_700_000_000_000, 5), Covers: 42, Term: 7}
}

func TestLiveTickRoundTrip(t *testing.T) {
	c := newCodec(t)
	for _, lt := range []messages.LiveTick{
		validLiveTick(t),
		{PChannel: pch(t, 0), TimeTick: 1, Covers: 1, Term: 1},
		{PChannel: pch(t, 15), TimeTick: math.MaxUint64, Covers: math.MaxUint64, Term: math.MaxUint64},
	} {
		m, err := c.EncodeLiveTick(lt)
		require.NoError(t, err)
		require.Equal(t, testCluster.LiveTickSubject(lt.PChannel), m.Subject)
		require.Empty(t, m.Data, "a live tick is all headers")
		require.Equal(t, lt.PChannel.String(), m.Header.Get(messages.HdrPChannel))
		require.Equal(t, strconv.FormatUint(uint64(lt.TimeTick), 10), m.Header.Get(messages.HdrTimeTick))
		got, err := c.DecodeLiveTick(m)
		require.NoError(t, err)
		require.Equal(t, lt, got)

		// Through the wire form, as a subscriber receives it.
		hdr, err := parseWireHeader(wireHeader(m.Header))
		require.NoError(t, err)
		got, err = c.DecodeLiveTick(&nats.Msg{Subject: m.Subject, Header: hdr})
		require.NoError(t, err)
		require.Equal(t, lt, got)
	}
}

func TestEncodeLiveTickInvalid(t *testing.T) {
	c := newCodec(t)
	for name, mut := range map[string]func(*messages.LiveTick){
		"no pchannel": func(lt *messages.LiveTick) { lt.PChannel = streamwal.PChannel{} },
		"no timetick": func(lt *messages.LiveTick) { lt.TimeTick = 0 },
		"no covers":   func(lt *messages.LiveTick) { lt.Covers = 0 },
		"no term":     func(lt *messages.LiveTick) { lt.Term = 0 },
		"all zero":    func(lt *messages.LiveTick) { *lt = messages.LiveTick{} },
	} {
		t.Run(name, func(t *testing.T) {
			lt := validLiveTick(t)
			mut(&lt)
			m, err := c.EncodeLiveTick(lt)
			require.Nil(t, m)
			requireInvalid(t, err, nil)
			t.Run("malformed", func(t *testing.T) {
				require.ErrorIs(t, err, messages.ErrMalformed)
			})
		})
	}
}

func TestDecodeLiveTickInvalid(t *testing.T) {
	c := newCodec(t)
	valid, err := c.EncodeLiveTick(validLiveTick(t))
	require.NoError(t, err)
	other, err := c.EncodeLiveTick(messages.LiveTick{PChannel: pch(t, 4), TimeTick: 1, Covers: 1, Term: 1})
	require.NoError(t, err)

	cases := map[string]*nats.Msg{
		"nil":        nil,
		"no headers": {Subject: valid.Subject},
	}
	with := func(f func(m *nats.Msg)) *nats.Msg {
		m := cloneMsg(valid)
		f(m)
		return m
	}
	for _, h := range []string{messages.HdrVersion, messages.HdrPChannel, messages.HdrTimeTick, messages.HdrCovers, messages.HdrTerm} {
		cases["missing "+h] = with(func(m *nats.Msg) { m.Header.Del(h) })
		cases["empty "+h] = with(func(m *nats.Msg) { m.Header.Set(h, "") })
		cases["garbled "+h] = with(func(m *nats.Msg) { m.Header.Set(h, "x1") })
		cases["negative "+h] = with(func(m *nats.Msg) { m.Header.Set(h, "-1") })
		cases["spaced "+h] = with(func(m *nats.Msg) { m.Header.Set(h, " 1") })
	}
	for _, h := range []string{messages.HdrTimeTick, messages.HdrCovers, messages.HdrTerm} {
		cases["zero "+h] = with(func(m *nats.Msg) { m.Header.Set(h, "0") })
		cases["overflowing "+h] = with(func(m *nats.Msg) { m.Header.Set(h, "18446744073709551616") })
		cases["hex "+h] = with(func(m *nats.Msg) { m.Header.Set(h, "0x10") })
	}
	for _, v := range []string{"2", "0", "01", "1.0", "v1"} {
		cases["version "+v] = with(func(m *nats.Msg) { m.Header.Set(messages.HdrVersion, v) })
	}
	for _, p := range []string{"pchan", "pchan-03", "pchan-x", "-3", "pchan-99999"} {
		cases["pchannel "+p] = with(func(m *nats.Msg) { m.Header.Set(messages.HdrPChannel, p) })
	}
	cases["subject of another pchannel"] = with(func(m *nats.Msg) { m.Subject = other.Subject })
	cases["pchannel header of another pchannel"] = with(func(m *nats.Msg) { m.Header.Set(messages.HdrPChannel, pch(t, 4).String()) })
	cases["subject of another cluster"] = with(func(m *nats.Msg) {
		m.Subject = streamwal.Cluster("c2").LiveTickSubject(pch(t, 3))
	})
	cases["a wal subject"] = with(func(m *nats.Msg) {
		m.Subject = testCluster.PChannelSubject(pch(t, 3), messages.TypeTimeTick.Token)
	})
	cases["empty subject"] = with(func(m *nats.Msg) { m.Subject = "" })

	for name, m := range cases {
		t.Run(name, func(t *testing.T) {
			lt, err := c.DecodeLiveTick(m)
			requireInvalid(t, err, messages.ErrMalformed)
			require.Zero(t, lt)
		})
	}

	// The same valid message decoded by another cluster's codec.
	c2, err := messages.NewCodec("c2", nil)
	require.NoError(t, err)
	_, err = c2.DecodeLiveTick(valid)
	requireInvalid(t, err, messages.ErrMalformed)
}

// TestDecodeLiveTickCanonical: like every other header the codec reads,
// a live tick's numbers have one spelling and each header one value.
func TestDecodeLiveTickCanonical(t *testing.T) {
	c := newCodec(t)
	valid, err := c.EncodeLiveTick(validLiveTick(t))
	require.NoError(t, err)
	for name, f := range map[string]func(m *nats.Msg){
		"leading zero": func(m *nats.Msg) { m.Header.Set(messages.HdrCovers, "042") },
		"repeated":     func(m *nats.Msg) { m.Header.Add(messages.HdrTerm, "8") },
	} {
		t.Run(name, func(t *testing.T) {
			m := cloneMsg(valid)
			f(m)
			_, err := c.DecodeLiveTick(m)
			requireInvalid(t, err, messages.ErrMalformed)
		})
	}
}

// FuzzDecodeLiveTick: the input is a subject, the five header values, and
// a mask of headers to leave out. DecodeLiveTick never panics, refuses
// with invalid-argument, malformed errors only, and whatever it accepts
// encodes again, on the same subject, to a message that decodes to the
// same tick.
func FuzzDecodeLiveTick(f *testing.F) {
	c := newCodec(f)
	headers := []string{messages.HdrVersion, messages.HdrPChannel, messages.HdrTimeTick, messages.HdrCovers, messages.HdrTerm}
	add := func(m *nats.Msg, drop byte) {
		f.Add(m.Subject, m.Header.Get(headers[0]), m.Header.Get(headers[1]), m.Header.Get(headers[2]), m.Header.Get(headers[3]), m.Header.Get(headers[4]), drop)
	}
	for _, lt := range []messages.LiveTick{
		validLiveTick(f),
		{PChannel: pch(f, 0), TimeTick: 1, Covers: 1, Term: 1},
		{PChannel: pch(f, 15), TimeTick: math.MaxUint64, Covers: math.MaxUint64, Term: math.MaxUint64},
	} {
		m, err := c.EncodeLiveTick(lt)
		require.NoError(f, err)
		add(m, 0)
		add(m, 1<<2)
	}
	f.Add("live.c1.pchan-3.tick", "1", "pchan-3", "01", "+1", "0", byte(0))
	f.Add("", "", "", "", "", "", byte(0xff))

	f.Fuzz(func(t *testing.T, subject, version, pchannel, timetick, covers, term string, drop byte) {
		m := nats.NewMsg(subject)
		for i, v := range []string{version, pchannel, timetick, covers, term} {
			if drop&(1<<i) == 0 {
				m.Header.Set(headers[i], v)
			}
		}
		lt, err := c.DecodeLiveTick(m)
		if err != nil {
			require.ErrorIs(t, err, streamwal.ErrInvalidArgument)
			require.ErrorIs(t, err, messages.ErrMalformed)
			require.Zero(t, lt)
			return
		}
		re, err := c.EncodeLiveTick(lt)
		require.NoError(t, err, "a decoded live tick must encode")
		require.Equal(t, subject, re.Subject, "the subject is canonical")
		back, err := c.DecodeLiveTick(re)
		require.NoError(t, err)
		require.Equal(t, lt, back)
	})
}
