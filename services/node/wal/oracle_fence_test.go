package wal_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/messages"
	"github.com/streamwal/streamwal/services/node/timetick"
	"github.com/streamwal/streamwal/services/node/wal"
)

// fencingOracle is an oracle that, once fenced, refuses as the
// coordinator refuses a superseded owner.
type fencingOracle struct {
	timetick.Oracle
	fenced atomic.Bool
	calls  atomic.Int64
}

// Allocate implements timetick.Oracle.
func (o *fencingOracle) Allocate(ctx context.Context, n uint32) (messages.TimeTick, error) {
	o.calls.Add(1)
	if o.fenced.Load() {
		return 0, streamwal.Errorf(streamwal.CodeFenced, "tso request for p under term 1: superseded, p is assigned under term 2")
	}
	return o.Oracle.Allocate(ctx, n)
}

// A WAL whose oracle refuses it as a superseded owner fails the append
// that needed the TimeTick with ErrFenced (asking the oracle once, not
// retrying), writes nothing, and stops as a fenced WAL does; an open
// refused so writes no barrier.
func TestOracleFencedOwnerStops(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	o := &fencingOracle{Oracle: e.oracle}
	cfg := e.config(1)
	cfg.Oracle, cfg.TimeTickBatch = o, 1     // every TimeTick is drawn
	cfg.SyncInterval = 20 * time.Millisecond // its loop sees the stop
	w, err := wal.Open(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = w.Close() })
	v := e.vchannel(42)
	e.createCollection(w, v)
	ruleAppend(t, w, e.insert(v, "before"))

	o.fenced.Store(true)
	calls := o.calls.Load()
	tail := ruleTail(t, e)
	_, err = w.Append(ctx, e.insert(v, "after"))
	ruleRefused(t, e, nil, streamwal.VChannel{}, tail, err, streamwal.ErrFenced)
	require.Contains(t, err.Error(), "superseded")
	require.LessOrEqual(t, o.calls.Load()-calls, int64(2), "a fenced allocation is not retried (one by the append, one at most by the sync loop)")
	require.ErrorIs(t, w.Err(), streamwal.ErrFenced)
	require.ErrorIs(t, w.Sync(ctx), streamwal.ErrFenced)
	select {
	case <-w.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("a WAL fenced by the oracle did not stop")
	}
	_, err = w.Append(ctx, e.insert(v, "after again"))
	require.ErrorIs(t, err, streamwal.ErrFenced)
	require.Equal(t, tail, ruleTail(t, e))

	_, err = wal.Open(ctx, cfg)
	require.ErrorIs(t, err, streamwal.ErrFenced, "an open refused a barrier timetick")
	require.Equal(t, tail, ruleTail(t, e))
}
