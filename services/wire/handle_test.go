package wire_test

import (
	"context"
	"encoding/json"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/services/wire"
)

// TestHandleRoundTrip: a typed handler gets its request decoded, with its
// names parsed, and its reply reaches the caller.
func TestHandleRoundTrip(t *testing.T) {
	nc := conn(t)
	p, err := streamwal.ParsePChannel("pchan-3")
	require.NoError(t, err)
	var got atomic.Value
	serve(t, nc, "t.open", wire.Handle(func(_ context.Context, req wire.OpenRequest) (wire.OpenReply, error) {
		got.Store(req)
		return wire.OpenReply{Barrier: 9, Session: "s", Version: req.Term}, nil
	}))
	var reply wire.OpenReply
	req := wire.OpenRequest{PChannel: p, Term: 4, Timeout: time.Second}
	require.NoError(t, wire.Call(ctxFor(t, 2*time.Second), nc, "t.open", req, &reply))
	require.Equal(t, wire.OpenReply{Barrier: 9, Session: "s", Version: 4}, reply)
	require.Equal(t, req, got.Load())
}

// TestHandleRefusesBeforeCalling: a malformed request, or one naming a
// bad PChannel, is refused with INVALID_ARGUMENT and the handler is not
// called.
func TestHandleRefusesBeforeCalling(t *testing.T) {
	nc := conn(t)
	var calls atomic.Int32
	serve(t, nc, "t.close", wire.Handle(func(context.Context, wire.CloseRequest) (wire.None, error) {
		calls.Add(1)
		return wire.None{}, nil
	}))
	for _, bad := range []string{`[]`, `{"pchannel":"nope_0"}`, `{"pchannel":"pchan-01"}`, `{"pchannel":7}`} {
		err := wire.Call(ctxFor(t, 2*time.Second), nc, "t.close", json.RawMessage(bad), nil)
		require.ErrorIs(t, err, streamwal.ErrInvalidArgument, bad)
	}
	require.Zero(t, calls.Load())
	require.NoError(t, wire.Call(ctxFor(t, 2*time.Second), nc, "t.close", json.RawMessage(`{"pchannel":"pchan-0"}`), nil))
	require.Equal(t, int32(1), calls.Load())
}

// TestHandleReplies: None is no body, an error is the error alone (its
// code and reason intact), any other reply is the body.
func TestHandleReplies(t *testing.T) {
	ctx := context.Background()
	none := wire.Handle(func(context.Context, wire.CloseRequest) (wire.None, error) { return wire.None{}, nil })
	body, err := none(ctx, []byte(`{}`))
	require.NoError(t, err)
	require.Nil(t, body)

	refused := wire.Handle(func(context.Context, wire.AllocateRequest) (wire.AllocateReply, error) {
		return wire.AllocateReply{VChannels: []string{"x"}}, streamwal.ErrCollectionExists
	})
	body, err = refused(ctx, []byte(`{"collection_id":1}`))
	require.ErrorIs(t, err, streamwal.ErrCollectionExists)
	require.Nil(t, body)

	status := wire.Handle(func(context.Context, struct{}) (wire.NodeStatusReply, error) {
		return wire.NodeStatusReply{Node: "n"}, nil
	})
	body, err = status(ctx, nil)
	require.ErrorIs(t, err, streamwal.ErrInvalidArgument, "an empty request is not JSON")
	body, err = status(ctx, []byte(`{}`))
	require.NoError(t, err)
	require.Equal(t, wire.NodeStatusReply{Node: "n"}, body)
}

// TestHandleAllocatesNoMore: the typed handler of the append subject
// allocates no more than its hand-written prologue does.
func TestHandleAllocatesNoMore(t *testing.T) {
	data := mustMarshal(t, richRequest())
	reply := richReply()
	ctx := context.Background()
	typed := wire.Handle(func(_ context.Context, req wire.AppendRequest) (wire.AppendReply, error) {
		if len(req.Messages) == 0 {
			return wire.AppendReply{}, streamwal.Errorf(streamwal.CodeInvalidArgument, "no messages")
		}
		return reply, nil
	})
	byHand := func(_ context.Context, data []byte) (any, error) {
		var req wire.AppendRequest
		if err := wire.Decode(data, &req); err != nil {
			return nil, err
		}
		if len(req.Messages) == 0 {
			return nil, streamwal.Errorf(streamwal.CodeInvalidArgument, "no messages")
		}
		return reply, nil
	}
	run := func(h wire.Handler) float64 {
		return testing.AllocsPerRun(200, func() {
			if _, err := h(ctx, data); err != nil {
				t.Fatal(err)
			}
		})
	}
	typedAllocs, byHandAllocs := run(typed), run(byHand)
	t.Logf("allocations per request: typed %v, by hand %v", typedAllocs, byHandAllocs)
	require.LessOrEqual(t, typedAllocs, byHandAllocs)
}
