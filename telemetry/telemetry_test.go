package telemetry_test

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/messages"
	"github.com/streamwal/streamwal/telemetry"
)

// Hooks implements every hook interface, so a list nests in another.
var (
	_ telemetry.AppendStartHook    = telemetry.Hooks(nil)
	_ telemetry.AppendHook         = telemetry.Hooks(nil)
	_ telemetry.UnitHook           = telemetry.Hooks(nil)
	_ telemetry.WriterRecoveryHook = telemetry.Hooks(nil)
	_ telemetry.FenceHook          = telemetry.Hooks(nil)
	_ telemetry.OpenHook           = telemetry.Hooks(nil)
	_ telemetry.CloseHook          = telemetry.Hooks(nil)
	_ telemetry.AssignHook         = telemetry.Hooks(nil)
	_ telemetry.HeartbeatHook      = telemetry.Hooks(nil)
	_ telemetry.TSOHook            = telemetry.Hooks(nil)
	_ telemetry.BroadcastHook      = telemetry.Hooks(nil)
	_ telemetry.BroadcastStuckHook = telemetry.Hooks(nil)
	_ telemetry.StorageHook        = telemetry.Hooks(nil)
	_ telemetry.ClientRequestHook  = telemetry.Hooks(nil)
	_ telemetry.ReplicationHook    = telemetry.Hooks(nil)
)

// p1 and p2 are PChannels of the tests.
var (
	p1, _ = streamwal.NewPChannel("pchan", 1)
	p2, _ = streamwal.NewPChannel("pchan", 2)
)

// appendsOnly cares about appends and nothing else.
type appendsOnly struct{ got []telemetry.AppendEvent }

func (a *appendsOnly) OnAppend(e telemetry.AppendEvent) { a.got = append(a.got, e) }

// opens cares about opens and closes.
type opens struct{ opened, closed int }

func (o *opens) OnOpen(telemetry.OpenEvent)   { o.opened++ }
func (o *opens) OnClose(telemetry.CloseEvent) { o.closed++ }

// TestHooksCallOnlyWhatTheyImplement: each event reaches the hooks that
// implement its interface, in a nested list too, and no other.
func TestHooksCallOnlyWhatTheyImplement(t *testing.T) {
	a, o := &appendsOnly{}, &opens{}
	hs := telemetry.Hooks{a, "not a hook", telemetry.Hooks{o}}
	e := telemetry.AppendEvent{PChannel: p1, Type: "Insert", Messages: 3, Latency: time.Millisecond}
	hs.OnAppend(e)
	hs.OnOpen(telemetry.OpenEvent{PChannel: p1, Err: errors.New("x")})
	hs.OnOpen(telemetry.OpenEvent{PChannel: p2})
	hs.OnClose(telemetry.CloseEvent{PChannel: p1, Reason: telemetry.ReasonFenced})
	hs.OnHeartbeat(telemetry.HeartbeatEvent{Node: "n"})
	require.Equal(t, []telemetry.AppendEvent{e}, a.got)
	require.Equal(t, 2, o.opened)
	require.Equal(t, 1, o.closed)
}

// TestNoHooksAllocateNothing: an empty list, or hooks that do not
// implement the event, cost no allocation.
func TestNoHooksAllocateNothing(t *testing.T) {
	var none telemetry.Hooks
	other := telemetry.Hooks{&opens{}}
	e := telemetry.AppendEvent{PChannel: p1, Type: "Insert", Code: streamwal.CodeUnavailable, Messages: 1}
	allocs := testing.AllocsPerRun(100, func() {
		none.OnAppend(e)
		other.OnAppend(e)
		none.OnUnit(telemetry.UnitEvent{PChannel: p1, Messages: 1})
	})
	require.Zero(t, allocs)
}

// BenchmarkNoHooks is the cost of an event nobody listens to.
func BenchmarkNoHooks(b *testing.B) {
	var none telemetry.Hooks
	e := telemetry.AppendEvent{PChannel: p1, Type: "Insert", Messages: 1}
	b.ReportAllocs()
	for b.Loop() {
		none.OnAppend(e)
	}
}

// replications records replication events.
type replications struct{ got []telemetry.ReplicationEvent }

func (r *replications) OnReplication(e telemetry.ReplicationEvent) { r.got = append(r.got, e) }

// TestReplicationLag: a replication event reaches its hooks in a nested
// list; its lag is the time since Through, known only while the
// replicator is active and Through is.
func TestReplicationLag(t *testing.T) {
	r := &replications{}
	now := time.Now()
	through := messages.TimeTickAt(now.Add(-3 * time.Second))
	e := telemetry.ReplicationEvent{PChannel: p1, Active: true, Source: "prim", Through: through}
	telemetry.Hooks{&opens{}, telemetry.Hooks{r}}.OnReplication(e)
	require.Equal(t, []telemetry.ReplicationEvent{e}, r.got)
	lag, ok := e.Lag(now)
	require.True(t, ok)
	require.Equal(t, now.Sub(through.Physical()), lag)
	require.GreaterOrEqual(t, lag, 3*time.Second)
	lag, ok = e.Lag(through.Physical().Add(-time.Second))
	require.True(t, ok)
	require.Zero(t, lag, "a clock behind the source's lags by nothing, not less")
	for _, unknown := range []telemetry.ReplicationEvent{
		{PChannel: p1, Active: true, Source: "prim"},
		{PChannel: p1, Through: through},
	} {
		_, ok := unknown.Lag(now)
		require.False(t, ok, "%+v", unknown)
	}
}

// TestIsFailure: server-side failures are told from refusals.
func TestIsFailure(t *testing.T) {
	require.True(t, telemetry.IsFailure(streamwal.CodeUnavailable))
	require.True(t, telemetry.IsFailure(streamwal.CodeInternal))
	require.False(t, telemetry.IsFailure(streamwal.CodeInvalidArgument))
	require.False(t, telemetry.IsFailure(streamwal.CodeFenced))
	require.False(t, telemetry.IsFailure(""))
}
