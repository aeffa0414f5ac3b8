package messages_test

import (
	"maps"
	"strconv"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/messages"
)

// headersOnly is msg as a headers-only consumer delivers it: the same
// headers, the payload's size in Nats-Msg-Size, and no payload.
func headersOnly(msg *nats.Msg) *nats.Msg {
	h := maps.Clone(msg.Header)
	h.Set(messages.HdrMsgSize, strconv.Itoa(len(msg.Data)))
	return &nats.Msg{Subject: msg.Subject, Header: h}
}

// TestDecodeHeadersOnlyMatchesDecode: every kind of real message read
// without its payload has the type and properties of the whole message,
// its payload's size, no payload, and a body that is a typed error.
func TestDecodeHeadersOnlyMatchesDecode(t *testing.T) {
	c := newCodec(t)
	for _, msg := range fuzzSeeds(t, c) {
		whole, err := c.Decode(msg, 7)
		require.NoError(t, err)
		part, err := c.DecodeHeadersOnly(headersOnly(msg), 7)
		require.NoError(t, err, "%s", msg.Subject)
		require.Same(t, whole.Type(), part.Type())
		require.Equal(t, whole.Header(), part.Header())
		require.Equal(t, whole.ID(), part.ID())
		require.True(t, part.HeadersOnly())
		require.False(t, whole.HeadersOnly())
		require.Nil(t, part.Payload())
		require.Equal(t, len(msg.Data), part.PayloadSize())
		require.Equal(t, len(msg.Data), whole.PayloadSize())
		if whole.Type().Body != nil {
			err := part.Body(new(messages.CreateCollectionBody))
			require.ErrorIs(t, err, messages.ErrNoPayload)
			require.ErrorIs(t, err, streamwal.ErrInvalidArgument)
		}
	}
}

// TestDecodeHeadersOnlyRefusesBadInput: a payload, a missing, repeated or
// malformed size, and bad properties are refused as malformed.
func TestDecodeHeadersOnlyRefusesBadInput(t *testing.T) {
	c := newCodec(t)
	good := headersOnly(validInsert(t, c))
	_, err := c.DecodeHeadersOnly(good, 1)
	require.NoError(t, err)
	_, err = c.DecodeHeadersOnly(good, 0)
	require.ErrorIs(t, err, streamwal.ErrInvalidArgument, "message id 0")
	_, err = c.DecodeHeadersOnly(nil, 1)
	require.ErrorIs(t, err, messages.ErrMalformed)
	withData := headersOnly(validInsert(t, c))
	withData.Data = []byte("x")
	_, err = c.DecodeHeadersOnly(withData, 1)
	require.ErrorIs(t, err, messages.ErrMalformed)
	for name, sizes := range map[string][]string{
		"missing": nil, "repeated": {"1", "1"}, "negative": {"-1"}, "leading zero": {"01"},
		"not a number": {"x"}, "signed": {"+1"}, "empty": {""}, "overflow": {"99999999999999999999999"},
	} {
		m := headersOnly(validInsert(t, c))
		m.Header[messages.HdrMsgSize] = sizes
		if sizes == nil {
			delete(m.Header, messages.HdrMsgSize)
		}
		_, err := c.DecodeHeadersOnly(m, 1)
		require.ErrorIs(t, err, messages.ErrMalformed, name)
		require.ErrorIs(t, err, streamwal.ErrInvalidArgument, name)
	}
	badType := headersOnly(validInsert(t, c))
	badType.Header.Set(messages.HdrType, "NoSuchType")
	_, err = c.DecodeHeadersOnly(badType, 1)
	require.ErrorIs(t, err, streamwal.ErrInvalidArgument)
}

// FuzzDecodeHeadersOnly: DecodeHeadersOnly never panics and refuses with
// invalid-argument errors only; whatever it accepts has no payload, the
// size its header gives, and, where Decode accepts the same properties
// with a body, the same type and properties.
func FuzzDecodeHeadersOnly(f *testing.F) {
	c := newCodec(f)
	for _, nm := range fuzzSeeds(f, c) {
		f.Add(nm.Subject, wireHeader(headersOnly(nm).Header), []byte(nil))
	}
	f.Add("wal.c1.pchan-3.p.timetick", []byte("Wal-Version: 1\r\nWal-Type: TimeTick\r\nNats-Msg-Size: 007\r\n"), []byte(nil))
	f.Fuzz(func(t *testing.T, subject string, block []byte, data []byte) {
		hdr, err := parseWireHeader(block)
		if err != nil {
			return
		}
		msg := &nats.Msg{Subject: subject, Header: hdr, Data: data}
		m, err := c.DecodeHeadersOnly(msg, 1)
		if err != nil {
			require.ErrorIs(t, err, streamwal.ErrInvalidArgument)
			return
		}
		require.Empty(t, data)
		require.Nil(t, m.Payload())
		require.GreaterOrEqual(t, m.PayloadSize(), 0)
		require.Equal(t, hdr.Get(messages.HdrMsgSize), strconv.Itoa(m.PayloadSize()))
		// The same properties with the body of an empty instance of the
		// type decode whole to the same message.
		whole := &nats.Msg{Subject: subject, Header: hdr}
		if m.Type().Body != nil {
			whole.Data = []byte("{}")
		}
		w, err := c.Decode(whole, 1)
		if err == nil {
			require.Same(t, w.Type(), m.Type())
			require.Equal(t, w.Header(), m.Header())
		}
	})
}
