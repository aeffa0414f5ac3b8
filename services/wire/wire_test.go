package wire_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/embedded"
	"github.com/streamwal/streamwal/messages"
	"github.com/streamwal/streamwal/services/wire"
)

// TestMain checks for leaked goroutines (the embedded server's own file
// store flushers are ignored, as in package integration).
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		goleak.IgnoreTopFunction("github.com/nats-io/nats-server/v2/server.(*fileStore).flushStreamStateLoop"),
		goleak.IgnoreTopFunction("github.com/nats-io/nats-server/v2/server.(*msgBlock).flushLoop"),
		goleak.IgnoreTopFunction("github.com/nats-io/nats-server/v2/server/ats.Register.func1"),
	)
}

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
	}}
	var got wire.AppendRequest
	serve(t, nc, "t.append", func(_ context.Context, data []byte) (any, error) {
		if err := wire.Decode(data, &got); err != nil {
			return nil, err
		}
		return want, nil
	})
	req := wire.AppendRequest{Messages: []wire.Message{
		{Subject: "wal.a.b", Header: nats.Header{"K": []string{"v1", "v2"}}, Data: []byte{0, 1, 2, 255}},
		{Subject: "wal.a.c"},
	}}
	var reply wire.AppendReply
	require.NoError(t, wire.Call(ctxFor(t, 2*time.Second), nc, "t.append", req, &reply))
	require.Equal(t, want, reply)
	require.Equal(t, req, got)
	require.ErrorIs(t, reply.Results[1].Error.Err(), streamwal.ErrFenced)
	require.NoError(t, reply.Results[0].Error.Err())
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
	var a wire.AppendRequest
	require.ErrorIs(t, wire.Decode([]byte(`{"messages":[{"data":"not base64!"}]}`), &a), streamwal.ErrInvalidArgument)
	require.ErrorIs(t, wire.Decode([]byte(`{"messages":{}}`), &a), streamwal.ErrInvalidArgument)
}

// normalize makes empty and absent headers and data alike: they encode
// alike (omitempty).
func normalize(r wire.AppendRequest) wire.AppendRequest {
	if r.Messages == nil {
		return r
	}
	out := wire.AppendRequest{Messages: make([]wire.Message, len(r.Messages))}
	for i, m := range r.Messages {
		if len(m.Header) == 0 {
			m.Header = nil
		}
		if len(m.Data) == 0 {
			m.Data = nil
		}
		out.Messages[i] = m
	}
	return out
}

func FuzzDecodeAppendRequest(f *testing.F) {
	seed := func(r wire.AppendRequest) {
		data, err := json.Marshal(r)
		require.NoError(f, err)
		f.Add(data)
	}
	seed(wire.AppendRequest{})
	seed(wire.AppendRequest{Messages: []wire.Message{}})
	seed(wire.AppendRequest{Messages: []wire.Message{
		{Subject: "wal.c.pchan-0.i", Header: nats.Header{"Wal-Msg-Id": {"x"}, "Wal-Type": {"insert"}}, Data: []byte("payload")},
		{Subject: "wal.c.pchan-0.d", Data: []byte{0, 0xff}},
		{},
	}})
	for _, s := range []string{
		``, `null`, `{}`, `{"messages":null}`, `{"messages":[null]}`, `{"messages":[{"header":{}}]}`,
		`{"messages":[{"header":{"a":null,"b":[]}}]}`, `{"messages":[{"data":""}]}`, `{"Messages":[{"SUBJECT":"x"}]}`,
		`{"messages":[{"subject":"\ud800"}]}`, `{"messages":[{"data":"AA=="}],"messages":[{"subject":"y"}]}`,
		`{"messages":[{"header":{"a":["1"]},"header":{"b":["2"]}}]}`, `{"messages":[1]}`, "{\"messages\":[{\"subject\":\"\xff\"}]}",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var req wire.AppendRequest
		if err := wire.Decode(data, &req); err != nil {
			require.ErrorIs(t, err, streamwal.ErrInvalidArgument)
			return
		}
		enc, err := json.Marshal(req)
		require.NoError(t, err)
		var again wire.AppendRequest
		require.NoError(t, wire.Decode(enc, &again), "re-decoding %s", enc)
		require.Equal(t, normalize(req), normalize(again))
		enc2, err := json.Marshal(again)
		require.NoError(t, err)
		require.Equal(t, string(enc), string(enc2), "encoding is not stable")
	})
}
