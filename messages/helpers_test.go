package messages_test

import (
	"errors"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/messages"
)

// Fixtures shared by the tests of this package. Cluster "c1" with the
// default PChannel prefix; collection 42 has shards on pchan-3 and pchan-5;
// the CChannel lives on pchan-0.
const testCluster streamwal.Cluster = "c1"

func pch(t testing.TB, i int) streamwal.PChannel {
	t.Helper()
	p, err := streamwal.NewPChannel(streamwal.DefaultPChannelPrefix, i)
	require.NoError(t, err)
	return p
}

func vch(t testing.TB, p, shard int) streamwal.VChannel {
	t.Helper()
	v, err := pch(t, p).VChannel(42, shard)
	require.NoError(t, err)
	return v
}

func cch(t testing.TB) streamwal.VChannel {
	t.Helper()
	return pch(t, 0).CChannel()
}

func newCodec(t testing.TB, opts ...messages.CodecOption) *messages.Codec {
	t.Helper()
	c, err := messages.NewCodec(testCluster, nil, opts...)
	require.NoError(t, err)
	return c
}

func mustTick(t testing.TB, ms int64, logical uint32) messages.TimeTick {
	t.Helper()
	tt, err := messages.NewTimeTick(timeMillis(ms), logical)
	require.NoError(t, err)
	return tt
}

func mustBody(t testing.TB, typ *messages.Type, body any) []byte {
	t.Helper()
	b, err := messages.MarshalBody(typ, body)
	require.NoError(t, err)
	return b
}

// requireInvalid asserts that err is an invalid-argument error with the
// given cause (nil: any cause).
func requireInvalid(t testing.TB, err error, cause error) {
	t.Helper()
	require.Error(t, err)
	require.ErrorIs(t, err, streamwal.ErrInvalidArgument, "error %v", err)
	require.Equal(t, streamwal.CodeInvalidArgument, streamwal.CodeOf(err))
	if cause != nil {
		require.ErrorIs(t, err, cause, "error %v", err)
	}
}

// requireSameMessage compares a decoded immutable message with the mutable
// message it was encoded from.
func requireSameMessage(t testing.TB, want *messages.MutableMessage, got *messages.ImmutableMessage) {
	t.Helper()
	require.Same(t, want.Type(), got.Type())
	require.Equal(t, want.Header(), got.Header())
	require.Equal(t, string(want.Payload()), string(got.Payload()))
	require.Equal(t, want.PChannel(), got.PChannel())
	require.Equal(t, want.VChannel(), got.VChannel())
	require.Equal(t, want.TimeTick(), got.TimeTick())
	require.Equal(t, want.MsgID(), got.MsgID())
	require.Equal(t, want.Txn(), got.Txn())
}

// roundTrip encodes m, decodes it at id and checks that nothing changed.
func roundTrip(t testing.TB, c *messages.Codec, m *messages.MutableMessage, id messages.MessageID) (*nats.Msg, *messages.ImmutableMessage) {
	t.Helper()
	nm, err := c.Encode(m)
	require.NoError(t, err)
	im, err := c.Decode(nm, id)
	require.NoError(t, err)
	require.Equal(t, id, im.ID())
	requireSameMessage(t, m, im)
	return nm, im
}

// cloneMsg deep-copies a NATS message so that a test case may corrupt it.
func cloneMsg(m *nats.Msg) *nats.Msg {
	out := nats.NewMsg(m.Subject)
	for k, vs := range m.Header {
		out.Header[k] = append([]string(nil), vs...)
	}
	out.Data = append([]byte(nil), m.Data...)
	return out
}

// wireHeader renders a header block the way nats.go does on publish
// (sorted here for determinism), without the leading "NATS/1.0\r\n" line and
// the closing blank line.
func wireHeader(h nats.Header) []byte {
	keys := make([]string, 0, len(h))
	for k := range h {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		for _, v := range h[k] {
			b.WriteString(k)
			b.WriteString(": ")
			b.WriteString(v)
			b.WriteString("\r\n")
		}
	}
	return []byte(b.String())
}

// parseWireHeader is the inverse of wireHeader through nats.go's own parser.
func parseWireHeader(block []byte) (nats.Header, error) {
	return nats.DecodeHeadersMsg(append(append([]byte("NATS/1.0\r\n"), block...), "\r\n"...))
}

func isAny(err error, targets ...error) bool {
	for _, t := range targets {
		if errors.Is(err, t) {
			return true
		}
	}
	return false
}

func timeMillis(ms int64) time.Time { return time.UnixMilli(ms) }
