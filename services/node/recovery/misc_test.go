package recovery

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/messages"
)

func TestCadence(t *testing.T) {
	t0 := time.Unix(1000, 0)
	for _, tc := range []struct {
		name  string
		c     Cadence
		after time.Duration
		dirty int
		due   bool
	}{
		{"nothing changed", Cadence{}, time.Hour, 0, false},
		{"before the interval", Cadence{}, 9 * time.Second, 99, false},
		{"at the interval", Cadence{}, 10 * time.Second, 1, true},
		{"dirty enough", Cadence{}, 0, 100, true},
		{"custom interval", Cadence{Interval: time.Second}, time.Second, 1, true},
		{"custom dirty", Cadence{Dirty: 3}, 0, 3, true},
		{"custom dirty below", Cadence{Dirty: 3}, 0, 2, false},
		{"negative values take defaults", Cadence{Interval: -1, Dirty: -1}, 9 * time.Second, 99, false},
		{"clock went back", Cadence{}, -time.Minute, 5, false},
	} {
		require.Equal(t, tc.due, tc.c.Due(t0.Add(tc.after), t0, tc.dirty), tc.name)
	}
	require.Equal(t, t0.Add(DefaultInterval), Cadence{}.Next(t0))
	require.Equal(t, t0.Add(time.Second), Cadence{Interval: time.Second}.Next(t0))
}

func TestAcceptLoss(t *testing.T) {
	for name, s := range map[string]Store{"memory": NewMemory(), "kv": natsStore(t)} {
		t.Run(name, func(t *testing.T) {
			ctx, p := testCtx(t), pch(t, 3)
			_, found, err := ReadAcceptLoss(ctx, s, p)
			require.NoError(t, err)
			require.False(t, found)
			require.NoError(t, ClearAcceptLoss(ctx, s, p), "clearing none")

			at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
			require.NoError(t, WriteAcceptLoss(ctx, s, p, AcceptLoss{Above: 41, By: "ops", At: at}))
			require.NoError(t, WriteAcceptLoss(ctx, s, p, AcceptLoss{Above: 42, By: "ops", At: at}), "replacing")
			a, found, err := ReadAcceptLoss(ctx, s, p)
			require.NoError(t, err)
			require.True(t, found)
			require.Equal(t, AcceptLoss{Above: 42, By: "ops", At: at}, a)
			v, _ := raw(t, s, streamwal.AcceptLossKey(p))
			require.JSONEq(t, `{"above":42,"by":"ops","at":"2026-01-02T03:04:05Z"}`, string(v))

			require.NoError(t, ClearAcceptLoss(ctx, s, p))
			_, found, err = ReadAcceptLoss(ctx, s, p)
			require.NoError(t, err)
			require.False(t, found)

			_, err = s.Put(ctx, streamwal.AcceptLossKey(p), []byte("[1]"), 0)
			require.NoError(t, err)
			_, _, err = ReadAcceptLoss(ctx, s, p)
			require.ErrorIs(t, err, ErrCorrupt)
		})
	}
}

func TestAcceptLossErrors(t *testing.T) {
	ctx, p := testCtx(t), pch(t, 3)
	down := errors.New("down")
	f := &Faulty{Store: NewMemory(), Fail: func(op, key string) error { return down }}
	_, _, err := ReadAcceptLoss(ctx, f, p)
	require.ErrorIs(t, err, streamwal.ErrUnavailable)
	require.ErrorIs(t, WriteAcceptLoss(ctx, f, p, AcceptLoss{Above: 1}), down)
	require.ErrorIs(t, ClearAcceptLoss(ctx, f, p), streamwal.ErrUnavailable)
}

// frozen builds an appended Insert on pchan-3's VChannel 42v0.
func frozen(t *testing.T, id messages.MessageID, tt messages.TimeTick, payload string) *messages.ImmutableMessage {
	t.Helper()
	return frozenOf(t, messages.TypeInsert, 0, id, tt, payload)
}

// frozenOf builds an appended message of type typ on pchan-3's VChannel
// 42v<shard>.
func frozenOf(t *testing.T, typ *messages.Type, shard int, id messages.MessageID, tt messages.TimeTick, payload string) *messages.ImmutableMessage {
	t.Helper()
	codec, err := messages.NewCodec(testCluster, nil)
	require.NoError(t, err)
	v, err := pch(t, 3).VChannel(42, shard)
	require.NoError(t, err)
	m, err := codec.New(typ, v, []byte(payload))
	require.NoError(t, err)
	m.SetTimeTick(tt)
	return m.Freeze(id)
}

func TestDigest(t *testing.T) {
	d := Digest(frozen(t, 7, 100, "abc"))
	require.Len(t, d, 2*digestLen)
	require.Equal(t, d, Digest(frozen(t, 7, 100, "abc")), "deterministic")
	require.NotEqual(t, d, Digest(frozen(t, 8, 100, "abc")), "id")
	require.NotEqual(t, d, Digest(frozen(t, 7, 101, "abc")), "timetick")
	require.NotEqual(t, d, Digest(frozen(t, 7, 100, "abd")), "payload")
	require.NotEqual(t, d, Digest(frozenOf(t, messages.TypeDelete, 0, 7, 100, "abc")), "type")
	require.NotEqual(t, d, Digest(frozenOf(t, messages.TypeInsert, 1, 7, 100, "abc")), "vchannel")
	require.Empty(t, Digest(nil))
}
