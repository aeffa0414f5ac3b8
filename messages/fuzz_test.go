package messages_test

import (
	"bytes"
	"errors"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/messages"
)

// fuzzSeeds are the encoded forms of real messages of many kinds.
func fuzzSeeds(tb testing.TB, c *messages.Codec) []*nats.Msg {
	seeds := []*nats.Msg{validInsert(tb, c), validBroadcastReplica(tb, c), validReplica(tb, c), validTimeTick(tb, c)}
	// Every built-in type.
	bodies := realisticBodies(tb)
	for _, typ := range messages.Builtins() {
		if typ.Is(messages.FlagSynthetic) {
			continue
		}
		for _, e := range buildRealistic(tb, c, typ, bodies[typ.Name]) {
			nm, err := c.Encode(e.msg)
			require.NoError(tb, err)
			seeds = append(seeds, nm)
		}
	}
	// A transaction body and a commit.
	ctx := messages.TxnContext{ID: 77, Keepalive: 1500 * time.Millisecond}
	body, err := c.New(messages.TypeDelete, vch(tb, 5, 0), []byte("pk=1"), messages.WithTxn(ctx), messages.WithDML(-3, 1))
	require.NoError(tb, err)
	body.SetTimeTick(99)
	commit, err := c.NewBody(messages.TypeCommitTxn, vch(tb, 5, 0), messages.CommitTxnBody{}, messages.WithTxn(ctx))
	require.NoError(tb, err)
	commit.SetTimeTick(100)
	for _, m := range []*messages.MutableMessage{body, commit} {
		nm, err := c.Encode(m)
		require.NoError(tb, err)
		seeds = append(seeds, nm)
	}
	return seeds
}

// FuzzDecode: the input is a subject, a header block in NATS wire form
// ("Key: Value\r\n" lines, parsed by nats.go itself), the payload, and the
// index of one header to drop. Decode never panics, refuses with invalid-argument errors
// only, and whatever it accepts is canonical: encoding the decoded message
// and decoding again gives the same message.
func FuzzDecode(f *testing.F) {
	c := newCodec(f)
	for _, nm := range fuzzSeeds(f, c) {
		f.Add(nm.Subject, wireHeader(nm.Header), nm.Data, byte(255))
	}
	// A few broken ones.
	f.Add("wal.c1.pchan-3.p.timetick", []byte("Wal-Version: 1\r\nWal-Type: TimeTick\r\nWal-PChannel: pchan-3\r\nWal-TimeTick: 01\r\n"), []byte("{}"), byte(255))
	f.Add("wal.c1.pchan-0.v.vcchan.txn", []byte("Wal-Version: 1\r\nWal-Type: Txn\r\nWal-PChannel: pchan-0\r\nWal-VChannel: pchan-0_vcchan\r\n"), []byte(""), byte(255))
	f.Add("", []byte(""), []byte(""), byte(0))

	f.Fuzz(func(t *testing.T, subject string, block []byte, data []byte, drop byte) {
		hdr, err := parseWireHeader(block)
		if err != nil {
			return
		}
		// drop removes one header (in key order), so that the fuzzer reaches
		// messages with a header missing in one step.
		if keys := slices.Sorted(maps.Keys(hdr)); int(drop) < len(keys) {
			delete(hdr, keys[drop])
		}
		msg := &nats.Msg{Subject: subject, Header: hdr, Data: data}
		im, err := c.Decode(msg, 1)
		// The decoder agrees with the reference one, whether its codec has
		// seen the subject before (c, most of the time) or not (fresh).
		ref, refErr := c.RefDecode(msg, 1)
		requireSameDecode(t, hdr, ref, refErr, im, err)
		fresh, freshErr := newCodec(t).Decode(msg, 1)
		requireSameDecode(t, hdr, ref, refErr, fresh, freshErr)
		if err != nil {
			require.ErrorIs(t, err, streamwal.ErrInvalidArgument)
			return
		}
		mm, err := c.DecodeMutable(msg)
		require.NoError(t, err)
		require.Equal(t, im.Header(), mm.Header())
		if len(data) > c.MaxPayload() {
			return // Decode does not enforce the limit; Encode does.
		}
		re, err := c.Encode(mm)
		require.NoError(t, err, "a decoded message must encode")
		require.Equal(t, subject, re.Subject, "subjects are canonical")
		im2, err := c.Decode(re, 1)
		require.NoError(t, err, "re-encoded headers %v (from %v)", re.Header, hdr)
		require.Same(t, im.Type(), im2.Type())
		require.Equal(t, im.Header(), im2.Header())
		require.True(t, bytes.Equal(im.Payload(), im2.Payload()))
		// The encoding is a fixed point after one round.
		mm2, err := c.DecodeMutable(re)
		require.NoError(t, err)
		re2, err := c.Encode(mm2)
		require.NoError(t, err)
		require.Equal(t, re.Header, re2.Header)
		require.Equal(t, re.Subject, re2.Subject)
	})
}

// FuzzParseResourceKey: the String form is canonical.
func FuzzParseResourceKey(f *testing.F) {
	for _, s := range []string{
		"S:Cluster:", "X:Cluster:", "X:Privilege:", "S:DBName:db", "X:CollectionName:db/coll",
		"S:SnapshotName:snap", "X:CollectionName:a:b:c", "S:DBName:", "Q:Cluster:", "S:Cluster:x",
		"S:DBName:a\x00", "S:Bogus:x", "", "S", "S:", "X:DBName:" + strings.Repeat("k", messages.MaxKeyLen),
		"S:DBName:ü", "S:DBName: db ",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		k, err := messages.ParseResourceKey(s)
		if err != nil {
			require.ErrorIs(t, err, streamwal.ErrInvalidArgument)
			require.ErrorIs(t, err, messages.ErrMalformed)
			return
		}
		require.True(t, k.Domain.Valid())
		require.Equal(t, s, k.String())
		back, err := messages.ParseResourceKey(k.String())
		require.NoError(t, err)
		require.Equal(t, k, back)
		require.Equal(t, []messages.ResourceKey{k}, messages.NormalizeKeys([]messages.ResourceKey{k, k}))
	})
}

// requireSameDecode asserts that a decoder gave what the reference decoder
// gave: the same message, or the same error. Only which of several bad
// application properties is reported may differ, as both visit them in map
// order.
func requireSameDecode(t *testing.T, hdr nats.Header, want *messages.ImmutableMessage, wantErr error, got *messages.ImmutableMessage, err error) {
	t.Helper()
	if wantErr != nil {
		require.Error(t, err, "the reference refused it: %v", wantErr)
		require.Equal(t, streamwal.CodeOf(wantErr), streamwal.CodeOf(err))
		for _, cause := range []error{messages.ErrMalformed, messages.ErrUnknownType, messages.ErrBadTarget, messages.ErrBadType, messages.ErrBadBody} {
			require.Equal(t, errors.Is(wantErr, cause), errors.Is(err, cause), "cause %v: %v against %v", cause, err, wantErr)
		}
		if appKeys(hdr) < 2 || !strings.Contains(wantErr.Error(), messages.HdrAppPrefix) {
			require.Equal(t, wantErr.Error(), err.Error())
		}
		return
	}
	require.NoError(t, err)
	require.Same(t, want.Type(), got.Type())
	require.Equal(t, want.ID(), got.ID())
	require.Equal(t, want.Header(), got.Header())
	require.True(t, bytes.Equal(want.Payload(), got.Payload()))
}

// appKeys counts the application properties of a header.
func appKeys(hdr nats.Header) int {
	n := 0
	for k := range hdr {
		if strings.HasPrefix(k, messages.HdrAppPrefix) {
			n++
		}
	}
	return n
}
