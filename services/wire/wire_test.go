package wire_test

import (
	"bytes"
	"context"
	"encoding"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/embedded"
	"github.com/streamwal/streamwal/messages"
	"github.com/streamwal/streamwal/services/wire"
)

// TestMain checks for leaked goroutines (see embedded.VerifyNoLeaks).
func TestMain(m *testing.M) { embedded.VerifyNoLeaks(m) }

// conn starts a server and connects to it.
func conn(t *testing.T) *nats.Conn {
	t.Helper()
	srv := embedded.StartTest(t)
	nc, err := srv.Connect()
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	return nc
}

// serve answers subject with h through wire.Respond.
func serve(t *testing.T, nc *nats.Conn, subject string, h wire.Handler) {
	t.Helper()
	sub, err := nc.Subscribe(subject, func(m *nats.Msg) {
		body, err := h(context.Background(), m.Data)
		if rerr := wire.Respond(m, body, err); rerr != nil {
			t.Errorf("respond: %v", rerr)
		}
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	require.NoError(t, nc.Flush())
}

func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func TestCallRoundTrip(t *testing.T) {
	nc := conn(t)
	serve(t, nc, "t.alloc", func(_ context.Context, data []byte) (any, error) {
		var req wire.AllocateRequest
		if err := wire.Decode(data, &req); err != nil {
			return nil, err
		}
		vs := make([]string, req.Shards)
		for i := range vs {
			vs[i] = fmt.Sprintf("pchan-%d_%dv%d", i, req.CollectionID, i)
		}
		return wire.AllocateReply{VChannels: vs}, nil
	})
	var reply wire.AllocateReply
	require.NoError(t, wire.Call(ctxFor(t, 2*time.Second), nc, "t.alloc", wire.AllocateRequest{CollectionID: 7, Shards: 2}, &reply))
	require.Equal(t, []string{"pchan-0_7v0", "pchan-1_7v1"}, reply.VChannels)

	// A nil reply ignores the body.
	require.NoError(t, wire.Call(ctxFor(t, 2*time.Second), nc, "t.alloc", wire.AllocateRequest{CollectionID: 7, Shards: 1}, nil))
}

func TestCallRoundTripOfEveryField(t *testing.T) {
	nc := conn(t)
	want := wire.AppendReply{Results: []wire.AppendResult{
		{ID: messages.MessageID(12), TimeTick: messages.TimeTick(1 << 40), LastConfirmed: messages.MessageID(10),
			TxnID: messages.TxnID(3), Keepalive: 5 * time.Second},
		{Error: &wire.Error{Code: streamwal.CodeFenced, Message: "fenced by term 3"}},
		{ID: math.MaxUint64, TimeTick: math.MaxUint64, LastConfirmed: math.MaxUint64, TxnID: math.MaxUint64,
			Keepalive: math.MinInt64},
		{Keepalive: math.MaxInt64, Error: &wire.Error{Code: streamwal.CodeInternal}},
		{Keepalive: -time.Nanosecond, Error: &wire.Error{Message: "an error without a code"}},
		{},
		{ID: 4, Error: &wire.Error{Code: streamwal.CodeLifecycle, Message: "gone", Reason: streamwal.ReasonCollectionDropped}},
	}}
	var got wire.AppendRequest
	var gotFirst byte
	serve(t, nc, "t.append", func(_ context.Context, data []byte) (any, error) {
		gotFirst = data[0]
		if err := wire.Decode(data, &got); err != nil {
			return nil, err
		}
		return want, nil
	})
	all := make([]byte, 256)
	for i := range all {
		all[i] = byte(i)
	}
	req := wire.AppendRequest{Messages: []wire.Message{
		{Subject: "wal.a.b", Header: nats.Header{"K": []string{"v1", "v2"}}, Data: []byte{0, 1, 2, 255}},
		{Subject: "wal.a.c"},
		{Subject: "wal.\x00\xff.é", Header: nats.Header{
			"Wal-Type": {"insert"}, "": {""}, "b": nil, "a": {"", "x", strings.Repeat("y", 300)}, "\xff": {"\x00"},
		}, Data: all},
		{},
	}}
	var reply wire.AppendReply
	require.NoError(t, wire.Call(ctxFor(t, 2*time.Second), nc, "t.append", req, &reply))
	require.Equal(t, want, reply)
	require.Equal(t, req, got)
	require.Equal(t, wire.BinaryVersion, gotFirst, "the request travels in binary")
	require.ErrorIs(t, reply.Results[1].Error.Err(), streamwal.ErrFenced)
	require.NoError(t, reply.Results[0].Error.Err())
	require.Equal(t, streamwal.Code(""), streamwal.CodeOf(reply.Results[4].Error.Err()), "an empty code stays empty")
	require.Error(t, reply.Results[4].Error.Err(), "an error with an empty code is still an error")
	require.ErrorIs(t, reply.Results[6].Error.Err(), streamwal.ErrCollectionDropped, "the reason crosses the hop")

	// The reply travels in binary too, without an envelope.
	data, err := req.MarshalBinary()
	require.NoError(t, err)
	raw, err := nc.Request("t.append", data, 2*time.Second)
	require.NoError(t, err)
	require.Equal(t, wire.BinaryVersion, raw.Data[0])
	var direct wire.AppendReply
	require.NoError(t, direct.UnmarshalBinary(raw.Data))
	require.Equal(t, want, direct)

	// Empty: a request without messages and a reply without results.
	want = wire.AppendReply{}
	reply = wire.AppendReply{Results: []wire.AppendResult{{ID: 1}}}
	require.NoError(t, wire.Call(ctxFor(t, 2*time.Second), nc, "t.append", wire.AppendRequest{}, &reply))
	require.Equal(t, wire.AppendRequest{}, got)
	require.Equal(t, wire.AppendReply{}, reply)
}

// TestAppendErrorsCarryCodes: a failing append handler answers with the
// JSON envelope, which Call tells from a binary reply.
func TestAppendErrorsCarryCodes(t *testing.T) {
	nc := conn(t)
	var code streamwal.Code
	serve(t, nc, "t.append", func(_ context.Context, data []byte) (any, error) {
		var req wire.AppendRequest
		if err := wire.Decode(data, &req); err != nil {
			return nil, err
		}
		if len(req.Messages) == 0 {
			return nil, streamwal.Errorf(streamwal.CodeInvalidArgument, "append request without messages")
		}
		return wire.AppendReply{}, streamwal.Errorf(code, "append of %d failed", len(req.Messages))
	})
	one := wire.AppendRequest{Messages: []wire.Message{{Subject: "wal.a.b", Data: []byte("x")}}}
	for _, s := range []*streamwal.Error{streamwal.ErrFenced, streamwal.ErrNotOwned, streamwal.ErrShuttingDown, streamwal.ErrInternal} {
		code = s.Code
		reply := wire.AppendReply{Results: []wire.AppendResult{{ID: 9}}}
		err := wire.Call(ctxFor(t, 2*time.Second), nc, "t.append", one, &reply)
		require.ErrorIs(t, err, s)
		require.Equal(t, s.Code, streamwal.CodeOf(err))
		require.Equal(t, s.Code.Retriable(), streamwal.IsRetriable(err))
		require.Contains(t, err.Error(), "append of 1 failed")
		require.Equal(t, []wire.AppendResult{{ID: 9}}, reply.Results, "an error leaves the reply alone")
	}

	// As the node does: an empty request is refused; so is JSON, or no
	// request at all, which the binary decoder refuses.
	err := wire.Call(ctxFor(t, 2*time.Second), nc, "t.append", wire.AppendRequest{}, nil)
	require.ErrorIs(t, err, streamwal.ErrInvalidArgument)
	require.Contains(t, err.Error(), "append request without messages")
	for _, body := range [][]byte{[]byte(`{"messages":[]}`), nil} {
		m, err := nc.Request("t.append", body, 2*time.Second)
		require.NoError(t, err)
		require.Equal(t, byte('{'), m.Data[0])
		err = wire.Call(ctxFor(t, 2*time.Second), replayRequester{m}, "t.append", struct{}{}, nil)
		require.ErrorIs(t, err, streamwal.ErrInvalidArgument)
		require.Contains(t, err.Error(), "malformed append request")
	}
}

// replayRequester answers every request with the same message.
type replayRequester struct{ m *nats.Msg }

func (r replayRequester) RequestWithContext(context.Context, string, []byte) (*nats.Msg, error) {
	return r.m, nil
}

// TestCallBinaryReplyMismatch: a binary reply needs a reply type that
// decodes it, and must decode.
func TestCallBinaryReplyMismatch(t *testing.T) {
	good, err := wire.AppendReply{Results: []wire.AppendResult{{ID: 1}}}.MarshalBinary()
	require.NoError(t, err)
	for _, tc := range []struct {
		name  string
		data  []byte
		reply any
	}{
		{"nil reply", good, nil},
		{"JSON reply", good, &wire.TSOReply{}},
		{"truncated", good[:len(good)-1], &wire.AppendReply{}},
		{"trailing", append(slices.Clone(good), 0), &wire.AppendReply{}},
		{"empty", []byte{}, &wire.AppendReply{}},
		{"request for reply", mustMarshal(t, wire.AppendRequest{Messages: []wire.Message{{Subject: "x"}}}), &wire.AppendReply{}},
	} {
		err := wire.Call(context.Background(), replayRequester{&nats.Msg{Data: tc.data}}, "t.x", struct{}{}, tc.reply)
		require.ErrorIs(t, err, streamwal.ErrInternal, tc.name)
		require.NotErrorIs(t, err, streamwal.ErrInvalidArgument, tc.name)
	}
	var reply wire.AppendReply
	require.NoError(t, wire.Call(context.Background(), replayRequester{&nats.Msg{Data: good}}, "t.x", struct{}{}, &reply))
	require.Equal(t, []wire.AppendResult{{ID: 1}}, reply.Results)
}

// braceBinary has a binary form that looks like JSON.
type braceBinary struct{ V int }

func (b braceBinary) MarshalBinary() ([]byte, error) { return []byte("{binary"), nil }

// emptyBinary has an empty binary form.
type emptyBinary struct{ V int }

func (emptyBinary) MarshalBinary() ([]byte, error) { return nil, nil }

// failingBinary cannot be encoded.
type failingBinary struct{}

func (failingBinary) MarshalBinary() ([]byte, error) { return nil, errors.New("no binary form") }

// TestRespondBinaryThatLooksLikeAnEnvelope: a binary form that Call would
// take for an envelope travels as JSON in the envelope.
func TestRespondBinaryThatLooksLikeAnEnvelope(t *testing.T) {
	nc := conn(t)
	serve(t, nc, "t.brace", func(context.Context, []byte) (any, error) { return braceBinary{V: 3}, nil })
	serve(t, nc, "t.empty", func(context.Context, []byte) (any, error) { return emptyBinary{V: 4}, nil })
	serve(t, nc, "t.failing", func(context.Context, []byte) (any, error) { return failingBinary{}, nil })
	var reply struct{ V int }
	require.NoError(t, wire.Call(ctxFor(t, 2*time.Second), nc, "t.brace", struct{}{}, &reply))
	require.Equal(t, 3, reply.V)
	require.NoError(t, wire.Call(ctxFor(t, 2*time.Second), nc, "t.empty", struct{}{}, &reply))
	require.Equal(t, 4, reply.V)
	err := wire.Call(ctxFor(t, 2*time.Second), nc, "t.failing", struct{}{}, &reply)
	require.ErrorIs(t, err, streamwal.ErrInternal)
	require.Contains(t, err.Error(), "no binary form")

	// A request whose binary form fails is not sent.
	err = wire.Call(context.Background(), failingRequester{}, "t.x", failingBinary{}, nil)
	require.ErrorIs(t, err, streamwal.ErrInvalidArgument)
}

func mustMarshal(t testing.TB, m encoding.BinaryMarshaler) []byte {
	t.Helper()
	data, err := m.MarshalBinary()
	require.NoError(t, err)
	return data
}

func TestCallCarriesErrorCodes(t *testing.T) {
	nc := conn(t)
	sentinels := []*streamwal.Error{
		streamwal.ErrInvalidArgument, streamwal.ErrNotOwned, streamwal.ErrTermMismatch, streamwal.ErrFenced,
		streamwal.ErrUnknownOutcome, streamwal.ErrDuplicate, streamwal.ErrTxnNotFound, streamwal.ErrTxnExpired,
		streamwal.ErrTxnInvalidState, streamwal.ErrLifecycle, streamwal.ErrResourceBusy, streamwal.ErrNotPrimary,
		streamwal.ErrNotSecondary, streamwal.ErrUnavailable, streamwal.ErrRateLimited, streamwal.ErrShuttingDown,
		streamwal.ErrClosed, streamwal.ErrUnrecoverable, streamwal.ErrInternal,
	}
	cause := errors.New("the cause")
	for i, s := range sentinels {
		for j, handlerErr := range []error{
			streamwal.Errorf(s.Code, "failure %d", i),
			fmt.Errorf("wrapped: %w", streamwal.Errorf(s.Code, "failure %d", i)),
			streamwal.Errorf(s.Code, "failure %d: %w", i, cause),
		} {
			subject := fmt.Sprintf("t.err.%d.%d", i, j)
			serve(t, nc, subject, func(context.Context, []byte) (any, error) { return "ignored", handlerErr })
			var reply struct{}
			err := wire.Call(ctxFor(t, 2*time.Second), nc, subject, struct{}{}, &reply)
			require.ErrorIs(t, err, s, "%s variant %d", s.Code, j)
			require.Equal(t, s.Code, streamwal.CodeOf(err))
			require.Equal(t, s.Code.Retriable(), streamwal.IsRetriable(err))
			require.Contains(t, err.Error(), fmt.Sprintf("failure %d", i))
			for _, o := range sentinels {
				if o != s {
					require.NotErrorIs(t, err, o)
				}
			}
		}
	}

	// An error without a code arrives as INTERNAL, with its text.
	serve(t, nc, "t.plain", func(context.Context, []byte) (any, error) { return nil, errors.New("plain failure") })
	err := wire.Call(ctxFor(t, 2*time.Second), nc, "t.plain", struct{}{}, nil)
	require.ErrorIs(t, err, streamwal.ErrInternal)
	require.Contains(t, err.Error(), "plain failure")
}

func TestCallNoResponders(t *testing.T) {
	nc := conn(t)
	err := wire.Call(ctxFor(t, 2*time.Second), nc, "t.nobody", struct{}{}, nil)
	require.ErrorIs(t, err, streamwal.ErrUnavailable)
	require.ErrorIs(t, err, nats.ErrNoResponders)
	require.True(t, streamwal.IsRetriable(err))
}

func TestCallDeadline(t *testing.T) {
	nc := conn(t)
	sub, err := nc.Subscribe("t.silent", func(*nats.Msg) {}) // never answers
	require.NoError(t, err)
	defer func() { _ = sub.Unsubscribe() }()
	start := time.Now()
	err = wire.Call(ctxFor(t, 100*time.Millisecond), nc, "t.silent", struct{}{}, nil)
	require.ErrorIs(t, err, streamwal.ErrUnavailable)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Less(t, time.Since(start), 2*time.Second)

	// A canceled context is the caller's doing: its own error.
	ctx, cancel := context.WithCancel(context.Background())
	go func() { time.Sleep(50 * time.Millisecond); cancel() }()
	err = wire.Call(ctx, nc, "t.silent", struct{}{}, nil)
	require.ErrorIs(t, err, context.Canceled)
}

func TestCallMalformedReplies(t *testing.T) {
	nc := conn(t)
	sub, err := nc.Subscribe("t.garbage", func(m *nats.Msg) { _ = m.Respond([]byte("not json")) })
	require.NoError(t, err)
	defer func() { _ = sub.Unsubscribe() }()
	err = wire.Call(ctxFor(t, 2*time.Second), nc, "t.garbage", struct{}{}, nil)
	require.ErrorIs(t, err, streamwal.ErrInternal)

	// A body that does not fit the reply type.
	serve(t, nc, "t.mismatch", func(context.Context, []byte) (any, error) { return "a string", nil })
	var reply wire.TSOReply
	err = wire.Call(ctxFor(t, 2*time.Second), nc, "t.mismatch", struct{}{}, &reply)
	require.ErrorIs(t, err, streamwal.ErrInternal)

	// A body the responder cannot encode.
	serve(t, nc, "t.unencodable", func(context.Context, []byte) (any, error) { return make(chan int), nil })
	err = wire.Call(ctxFor(t, 2*time.Second), nc, "t.unencodable", struct{}{}, &reply)
	require.ErrorIs(t, err, streamwal.ErrInternal)

	// No body at all leaves the reply as it was.
	serve(t, nc, "t.empty", func(context.Context, []byte) (any, error) { return nil, nil })
	reply = wire.TSOReply{First: 5}
	require.NoError(t, wire.Call(ctxFor(t, 2*time.Second), nc, "t.empty", struct{}{}, &reply))
	require.Equal(t, messages.TimeTick(5), reply.First)
}

func TestCallUnencodableRequest(t *testing.T) {
	// Fails before anything is sent: no connection needed.
	err := wire.Call(context.Background(), failingRequester{}, "t.x", make(chan int), nil)
	require.ErrorIs(t, err, streamwal.ErrInvalidArgument)
}

// failingRequester answers every request with err.
type failingRequester struct{ err error }

func (f failingRequester) RequestWithContext(context.Context, string, []byte) (*nats.Msg, error) {
	if f.err == nil {
		panic("unexpected request")
	}
	return nil, f.err
}

func TestCallTransportErrorsAreUnavailable(t *testing.T) {
	for _, e := range []error{nats.ErrTimeout, nats.ErrNoResponders, nats.ErrConnectionClosed, errors.New("other")} {
		err := wire.Call(context.Background(), failingRequester{err: e}, "t.x", struct{}{}, nil)
		require.ErrorIs(t, err, streamwal.ErrUnavailable, "%v", e)
		require.ErrorIs(t, err, e)
	}
}

func TestErrorConversion(t *testing.T) {
	require.Nil(t, wire.ErrorOf(nil))
	var nilErr *wire.Error
	require.NoError(t, nilErr.Err())

	we := wire.ErrorOf(streamwal.Errorf(streamwal.CodeNotOwned, "pchan-1 moved"))
	require.Equal(t, &wire.Error{Code: streamwal.CodeNotOwned, Message: "pchan-1 moved"}, we)
	require.ErrorIs(t, we.Err(), streamwal.ErrNotOwned)

	we = wire.ErrorOf(errors.New("boom"))
	require.Equal(t, &wire.Error{Code: streamwal.CodeInternal, Message: "boom"}, we)

	// The JSON form.
	data, err := json.Marshal(wire.ErrorOf(streamwal.ErrFenced))
	require.NoError(t, err)
	require.JSONEq(t, `{"code":"CHANNEL_FENCED"}`, string(data))
}

func TestDecode(t *testing.T) {
	var req wire.TSORequest
	require.NoError(t, wire.Decode([]byte(`{"count":3}`), &req))
	require.Equal(t, uint32(3), req.Count)
	for _, bad := range []string{"", "{", "[]", `{"count":-1}`, `{"count":"3"}`, `{"count":1}x`, `{"count":4294967296}`} {
		require.ErrorIs(t, wire.Decode([]byte(bad), &req), streamwal.ErrInvalidArgument, "%q", bad)
	}
	// The append request is binary: its JSON form is refused.
	var a wire.AppendRequest
	for _, bad := range []string{`{"messages":[]}`, `{"messages":[{"subject":"x"}]}`, "", "\x00"} {
		err := wire.Decode([]byte(bad), &a)
		require.ErrorIs(t, err, streamwal.ErrInvalidArgument, "%q", bad)
		require.Contains(t, err.Error(), "malformed append request")
	}
}

// richRequest has every field, with empty and awkward values.
func richRequest() wire.AppendRequest {
	return wire.AppendRequest{Messages: []wire.Message{
		{Subject: "wal.c.pchan-0.i", Header: nats.Header{"Wal-Msg-Id": {"x"}, "Wal-Type": {"insert"}, "A": {"1", "", "3"}, "E": nil},
			Data: []byte("payload")},
		{Subject: "wal.c.pchan-0.d", Data: []byte{0, 0xff}},
		{},
		{Header: nats.Header{"": {""}}, Data: bytes.Repeat([]byte{0x80}, 200)},
	}}
}

// richReply has every field, with zero, extreme and error results.
func richReply() wire.AppendReply {
	return wire.AppendReply{Results: []wire.AppendResult{
		{ID: 1, TimeTick: 1 << 60, LastConfirmed: 1, TxnID: 7, Keepalive: time.Minute},
		{},
		{ID: math.MaxUint64, TimeTick: math.MaxUint64, LastConfirmed: math.MaxUint64, TxnID: math.MaxUint64, Keepalive: math.MinInt64},
		{Keepalive: math.MaxInt64, Error: &wire.Error{Code: streamwal.CodeDuplicate, Message: strings.Repeat("m", 200)}},
		{Error: &wire.Error{}},
	}}
}

func uv(b []byte, xs ...uint64) []byte {
	for _, x := range xs {
		b = binary.AppendUvarint(b, x)
	}
	return b
}

// TestDecodeMalformedBinary: every malformed binary form is
// ErrInvalidArgument, and none allocates in proportion to what it claims.
func TestDecodeMalformedBinary(t *testing.T) {
	v := wire.BinaryVersion
	decodeRequest := func(data []byte) error {
		var r wire.AppendRequest
		err := wire.Decode(data, &r)
		var c wire.AppendRequest
		cerr := c.UnmarshalBinary(data)
		require.Equal(t, err == nil, cerr == nil, "Decode and UnmarshalBinary agree on %x", data)
		return err
	}
	decodeReply := func(data []byte) error {
		var r wire.AppendReply
		return r.UnmarshalBinary(data)
	}
	req, rep := mustMarshal(t, richRequest()), mustMarshal(t, richReply())
	require.NoError(t, decodeRequest(req))
	require.NoError(t, decodeReply(rep))

	// Truncated at every byte.
	for i := range req {
		require.ErrorIs(t, decodeRequest(req[:i]), streamwal.ErrInvalidArgument, "request truncated at %d", i)
	}
	for i := range rep {
		require.ErrorIs(t, decodeReply(rep[:i]), streamwal.ErrInvalidArgument, "reply truncated at %d", i)
	}

	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for _, tc := range []struct {
		name    string
		request bool
		data    []byte
		text    string
	}{
		{"request: unknown version", true, append([]byte{0x03}, req[1:]...), "unknown format version 0x3"},
		{"request: the version before reasons", true, append([]byte{0x01}, req[1:]...), "unknown format version 0x1"},
		{"request: version 0", true, append([]byte{0x00}, req[1:]...), "unknown format version"},
		{"request: JSON", true, []byte(`{"messages":[]}`), "unknown format version 0x7b"},
		{"request: empty", true, nil, "empty"},
		{"request: trailing byte", true, append(slices.Clone(req), 0), "trailing bytes (1)"},
		{"request: trailing bytes", true, append(slices.Clone(req), "xyz"...), "trailing bytes (3)"},
		{"request: huge message count", true, uv([]byte{v}, 1<<62), "exceeds"},
		{"request: max message count", true, uv([]byte{v}, math.MaxUint64, 0, 0, 0), "exceeds"},
		{"request: one message too many", true, uv([]byte{v}, 2, 0, 0, 0), "exceeds"},
		{"request: huge subject", true, uv([]byte{v}, 1, 1<<40, 0, 0), "exceeds"},
		{"request: huge key count", true, uv([]byte{v}, 1, 0, 1<<40, 0), "exceeds"},
		{"request: huge key", true, uv([]byte{v}, 1, 0, 1, math.MaxUint64, 0, 0), "exceeds"},
		{"request: huge value count", true, uv([]byte{v}, 1, 0, 1, 0, 1<<40, 0), "exceeds"},
		{"request: huge value", true, uv([]byte{v}, 1, 0, 1, 0, 1, 1<<40, 0), "exceeds"},
		{"request: huge data", true, uv([]byte{v}, 1, 0, 0, math.MaxUint64), "exceeds"},
		{"request: varint overflow", true, append([]byte{v}, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f), "overflows"},
		{"request: keys out of order", true, append(uv([]byte{v}, 1, 0, 2, 1, 'b', 0, 1, 'a', 0), 0), "out of order"},
		{"request: repeated key", true, append(uv([]byte{v}, 1, 0, 2, 1, 'a', 0, 1, 'a', 0), 0), "out of order"},
		{"reply: unknown version", false, append([]byte{'{'}, rep[1:]...), "unknown format version 0x7b"},
		{"reply: empty", false, []byte{}, "empty"},
		{"reply: trailing byte", false, append(slices.Clone(rep), 0), "trailing bytes (1)"},
		{"reply: huge result count", false, uv([]byte{v}, 1<<62), "exceeds"},
		{"reply: max result count", false, uv([]byte{v}, math.MaxUint64, 0, 0, 0, 0, 0, 0), "exceeds"},
		{"reply: one result too many", false, uv([]byte{v}, 2, 0, 0, 0, 0, 0, 0), "exceeds"},
		{"reply: huge code", false, uv([]byte{v}, 1, 0, 0, 0, 0, 0, math.MaxUint64), "exceeds"},
		{"reply: huge message", false, uv([]byte{v}, 1, 0, 0, 0, 0, 0, 1, 1<<40), "exceeds"},
		{"reply: huge reason", false, uv([]byte{v}, 1, 0, 0, 0, 0, 0, 1, 0, 1<<40), "exceeds"},
		{"reply: varint overflow", false, append(uv([]byte{v}, 1), 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f, 0, 0, 0, 0, 0), "overflows"},
		{"reply: keepalive overflow", false, append(uv([]byte{v}, 1, 0, 0, 0, 0), 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f, 0), "overflows"},
	} {
		decode := decodeReply
		if tc.request {
			decode = decodeRequest
		}
		err := decode(tc.data)
		require.ErrorIs(t, err, streamwal.ErrInvalidArgument, tc.name)
		require.Contains(t, err.Error(), tc.text, tc.name)
	}
	runtime.ReadMemStats(&after)
	require.Less(t, after.TotalAlloc-before.TotalAlloc, uint64(1<<20), "forged counts allocated")
}

// TestDecodeSharesData: Decode's messages refer to the request for their
// data, UnmarshalBinary's to a copy; neither lets an append to one
// message's data run into the next.
func TestDecodeSharesData(t *testing.T) {
	req := wire.AppendRequest{Messages: []wire.Message{
		{Subject: "a", Data: []byte("first")}, {Subject: "b", Data: []byte("second")},
	}}
	for _, shared := range []bool{true, false} {
		data := mustMarshal(t, req)
		var got wire.AppendRequest
		if shared {
			require.NoError(t, wire.Decode(data, &got))
		} else {
			require.NoError(t, got.UnmarshalBinary(data))
		}
		require.Equal(t, req, got)
		for i := range got.Messages {
			require.Equal(t, len(got.Messages[i].Data), cap(got.Messages[i].Data))
		}
		_ = append(got.Messages[0].Data, "XXXXXXXXXXXX"...)
		require.Equal(t, "second", string(got.Messages[1].Data))
		copy(data[bytes.Index(data, []byte("first")):], "FIRST")
		if shared {
			require.Equal(t, "FIRST", string(got.Messages[0].Data))
		} else {
			require.Equal(t, "first", string(got.Messages[0].Data))
		}
		require.Equal(t, "a", got.Messages[0].Subject, "strings never share")
	}
}

// TestBinaryEncodingIsDeterministic: header keys go sorted, whatever the
// map's order, and the encoding has exactly the size it allocated.
func TestBinaryEncodingIsDeterministic(t *testing.T) {
	hdr := nats.Header{}
	for i := range 50 {
		hdr.Set(fmt.Sprintf("Key-%02d", i), fmt.Sprint(i))
	}
	req := wire.AppendRequest{Messages: []wire.Message{{Subject: "s", Header: hdr, Data: []byte("d")}}}
	first := mustMarshal(t, req)
	require.Equal(t, len(first), cap(first))
	for range 20 {
		require.Equal(t, first, mustMarshal(t, req))
	}
	rep := mustMarshal(t, richReply())
	require.Equal(t, len(rep), cap(rep))
	require.Equal(t, []byte{wire.BinaryVersion, 0}, mustMarshal(t, wire.AppendRequest{}))
	require.Equal(t, []byte{wire.BinaryVersion, 0}, mustMarshal(t, wire.AppendReply{}))
}

func FuzzDecodeAppendRequest(f *testing.F) {
	for _, r := range []wire.AppendRequest{
		{}, {Messages: []wire.Message{}}, richRequest(),
		{Messages: []wire.Message{{Subject: "wal.c.pchan-0.i", Header: nats.Header{"Wal-Msg-Id": {"x"}}}}},
	} {
		data := mustMarshal(f, r)
		f.Add(data)
		f.Add(data[:len(data)-1])
		f.Add(append(slices.Clone(data), 0))
	}
	for _, s := range []string{``, "\x01", "\x02\x00", `{}`, `{"messages":[{"data":"AA=="}]}`, "\x01\x01\x00\x02\x01b\x00\x01a\x00\x00"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var req wire.AppendRequest
		if err := wire.Decode(data, &req); err != nil {
			require.ErrorIs(t, err, streamwal.ErrInvalidArgument)
			var c wire.AppendRequest
			require.ErrorIs(t, c.UnmarshalBinary(data), streamwal.ErrInvalidArgument)
			return
		}
		var c wire.AppendRequest
		require.NoError(t, c.UnmarshalBinary(data))
		require.Equal(t, req, c)
		enc := mustMarshal(t, req)
		require.LessOrEqual(t, len(enc), len(data), "the encoding is at most as long as any form of it")
		var again wire.AppendRequest
		require.NoError(t, wire.Decode(enc, &again), "re-decoding %x", enc)
		require.Equal(t, req, again)
		require.Equal(t, enc, mustMarshal(t, again), "encoding is not stable")
	})
}

func FuzzDecodeAppendReply(f *testing.F) {
	for _, r := range []wire.AppendReply{
		{}, {Results: []wire.AppendResult{}}, richReply(),
		{Results: []wire.AppendResult{{ID: 3, Error: &wire.Error{Code: streamwal.CodeFenced}}}},
	} {
		data := mustMarshal(f, r)
		f.Add(data)
		f.Add(data[:len(data)-1])
		f.Add(append(slices.Clone(data), 0))
	}
	for _, s := range []string{``, "\x01", "\x02\x00", `{}`, "\x01\x01\x00\x00\x00\x00\x00\x01\x00"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var rep wire.AppendReply
		if err := rep.UnmarshalBinary(data); err != nil {
			require.ErrorIs(t, err, streamwal.ErrInvalidArgument)
			return
		}
		enc := mustMarshal(t, rep)
		require.LessOrEqual(t, len(enc), len(data), "the encoding is at most as long as any form of it")
		var again wire.AppendReply
		require.NoError(t, again.UnmarshalBinary(enc), "re-decoding %x", enc)
		require.Equal(t, rep, again)
		require.Equal(t, enc, mustMarshal(t, again), "encoding is not stable")
	})
}

// appendBatch is a request like the client's: n inserts of 1 KiB, each
// with the headers the codec gives them, and the node's reply to it.
func appendBatch(b *testing.B, n int) (wire.AppendRequest, wire.AppendReply) {
	codec, err := messages.NewCodec("c1", nil)
	require.NoError(b, err)
	p, err := streamwal.NewPChannel(streamwal.DefaultPChannelPrefix, 3)
	require.NoError(b, err)
	v, err := p.VChannel(449012345678901234, 1)
	require.NoError(b, err)
	payload := make([]byte, 1024)
	for i := range payload {
		payload[i] = byte(i * 7)
	}
	req := wire.AppendRequest{Messages: make([]wire.Message, n)}
	reply := wire.AppendReply{Results: make([]wire.AppendResult, n)}
	first, err := messages.NewTimeTick(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), 0)
	require.NoError(b, err)
	for i := range n {
		m, err := codec.New(messages.TypeInsert, v, payload,
			messages.WithMsgID(fmt.Sprintf("018f3a2c-7b1e-7c4d-9a8b-%012d", i)), messages.WithDML(449012345678905678, 16))
		require.NoError(b, err)
		nm, err := codec.Encode(m)
		require.NoError(b, err)
		req.Messages[i] = wire.Message{Subject: nm.Subject, Header: nm.Header, Data: nm.Data}
		reply.Results[i] = wire.AppendResult{ID: messages.MessageID(1_000_000 + i), TimeTick: first + messages.TimeTick(i),
			LastConfirmed: 999_000}
	}
	return req, reply
}

// BenchmarkAppendCodec compares the JSON and the binary forms of an
// append request of 512 messages and of its reply, each encoded and
// decoded as Call, Respond and Decode do (the JSON reply in its envelope).
func BenchmarkAppendCodec(b *testing.B) {
	const n = 512
	req, reply := appendBatch(b, n)
	b.Logf("%d messages, %d headers each, subject %q", n, len(req.Messages[0].Header), req.Messages[0].Subject)
	type envelope struct {
		Error *wire.Error     `json:"error,omitempty"`
		Body  json.RawMessage `json:"body,omitempty"`
	}
	report := func(b *testing.B, size int) {
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/n, "ns/msg")
		b.ReportMetric(float64(size)/n, "B/msg")
	}
	b.Run("request/json", func(b *testing.B) {
		b.ReportAllocs()
		size := 0
		for b.Loop() {
			data, err := json.Marshal(req)
			if err != nil {
				b.Fatal(err)
			}
			var got wire.AppendRequest
			if err := json.Unmarshal(data, &got); err != nil || len(got.Messages) != n {
				b.Fatal(err)
			}
			size = len(data)
		}
		report(b, size)
	})
	b.Run("request/binary", func(b *testing.B) {
		b.ReportAllocs()
		size := 0
		for b.Loop() {
			data, err := req.MarshalBinary()
			if err != nil {
				b.Fatal(err)
			}
			var got wire.AppendRequest
			if err := wire.Decode(data, &got); err != nil || len(got.Messages) != n {
				b.Fatal(err)
			}
			size = len(data)
		}
		report(b, size)
	})
	b.Run("reply/json", func(b *testing.B) {
		b.ReportAllocs()
		size := 0
		for b.Loop() {
			body, err := json.Marshal(reply)
			if err != nil {
				b.Fatal(err)
			}
			data, err := json.Marshal(envelope{Body: body})
			if err != nil {
				b.Fatal(err)
			}
			var env envelope
			if err := json.Unmarshal(data, &env); err != nil {
				b.Fatal(err)
			}
			var got wire.AppendReply
			if err := json.Unmarshal(env.Body, &got); err != nil || len(got.Results) != n {
				b.Fatal(err)
			}
			size = len(data)
		}
		report(b, size)
	})
	b.Run("reply/binary", func(b *testing.B) {
		b.ReportAllocs()
		size := 0
		for b.Loop() {
			data, err := reply.MarshalBinary()
			if err != nil {
				b.Fatal(err)
			}
			var got wire.AppendReply
			if err := got.UnmarshalBinary(data); err != nil || len(got.Results) != n {
				b.Fatal(err)
			}
			size = len(data)
		}
		report(b, size)
	})
}

// An assignment's open error is in its JSON only when there is one, so
// records written before it existed and records of served PChannels read
// the same.
func TestAssignmentErrorJSON(t *testing.T) {
	data, err := json.Marshal(wire.Assignment{PChannel: "pchan-1", State: wire.Assigned})
	require.NoError(t, err)
	require.NotContains(t, string(data), `"error"`)
	data, err = json.Marshal(wire.Assignment{PChannel: "pchan-1", State: wire.Unavailable, Error: "HISTORY_LOST: lost"})
	require.NoError(t, err)
	require.Contains(t, string(data), `"error":"HISTORY_LOST: lost"`)
	var a wire.Assignment
	require.NoError(t, json.Unmarshal([]byte(`{"pchannel":"pchan-1","term":2,"state":"ASSIGNED","vchannels":0,"epoch":1}`), &a))
	require.Empty(t, a.Error)
}

// TestCallCarriesReasons: a refusal's reason crosses the hop, in the JSON
// envelope and in an append reply's binary results, so that errors.Is
// matches its sentinel on the caller's side.
func TestCallCarriesReasons(t *testing.T) {
	nc := conn(t)
	refusal := streamwal.Errorf(streamwal.CodeLifecycle, "CreateCollection of 3: %w", streamwal.ErrCollectionExists)
	serve(t, nc, "t.reason", func(context.Context, []byte) (any, error) { return nil, refusal })
	err := wire.Call(ctxFor(t, 2*time.Second), nc, "t.reason", struct{}{}, nil)
	require.ErrorIs(t, err, streamwal.ErrCollectionExists)
	require.ErrorIs(t, err, streamwal.ErrLifecycle)
	require.NotErrorIs(t, err, streamwal.ErrCollectionNotFound)

	serve(t, nc, "t.reason.append", func(context.Context, []byte) (any, error) {
		return wire.AppendReply{Results: []wire.AppendResult{wire.ResultOf(nil, refusal)}}, nil
	})
	var reply wire.AppendReply
	one := wire.AppendRequest{Messages: []wire.Message{{Subject: "wal.a.b", Data: []byte("x")}}}
	require.NoError(t, wire.Call(ctxFor(t, 2*time.Second), nc, "t.reason.append", one, &reply))
	require.Len(t, reply.Results, 1)
	require.ErrorIs(t, reply.Results[0].Error.Err(), streamwal.ErrCollectionExists)
}
