package coord_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/streamwal/streamwal/client"
	"github.com/streamwal/streamwal/embedded"
	"github.com/streamwal/streamwal/embedded/system"
	"github.com/streamwal/streamwal/services/coord"
	"github.com/streamwal/streamwal/services/wire"
	"github.com/streamwal/streamwal/telemetry"
)

// coordRecorder keeps the coordinator events it hears.
type coordRecorder struct {
	mu         sync.Mutex
	assigned   map[string]bool // PChannels reported ASSIGNED and serving
	tso        int
	broadcasts []telemetry.BroadcastEvent
	stuck      int // reports of the stuck count
}

func (r *coordRecorder) OnAssign(e telemetry.AssignEvent) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if e.State == string(wire.Assigned) && e.Serving {
		r.assigned[e.PChannel.String()] = true
	}
}

func (r *coordRecorder) OnTSO(e telemetry.TSOEvent) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if e.Err == nil && e.Count > 0 {
		r.tso++
	}
}

func (r *coordRecorder) OnBroadcast(e telemetry.BroadcastEvent) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.broadcasts = append(r.broadcasts, e)
}

func (r *coordRecorder) OnBroadcastStuck(e telemetry.BroadcastStuckEvent) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if e.Stuck == 0 {
		r.stuck++
	}
}

// TestCoordinatorHooksAndReadiness: the active coordinator reports each
// PChannel's assignment, the TimeTicks it hands out and a broadcast; the
// active coordinator and the standby are both ready.
func TestCoordinatorHooksAndReadiness(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rec := &coordRecorder{assigned: map[string]bool{}}
	sys, err := system.Start(ctx, system.Options{Cluster: "chooks", Coordinators: 2, ServerOptions: embedded.Options{StoreDir: t.TempDir()},
		Coord: coord.Config{PChannels: 2, Hooks: telemetry.Hooks{rec}}})
	require.NoError(t, err)
	defer sys.Close()
	v, err := sys.WaitServing(ctx, false)
	require.NoError(t, err)
	for _, c := range sys.Coordinators() {
		require.NoError(t, c.Ready(), "coordinator %s", c.ID())
	}

	c, err := client.Connect(sys.Server.ClientURL(), client.WithCluster("chooks"), client.WithoutLocalBypass())
	require.NoError(t, err)
	defer c.Close()
	_, err = c.CreateCollection(ctx, client.Collection{DBName: "db", Name: "hooks", ID: 3})
	require.NoError(t, err)

	require.Eventually(t, func() bool {
		rec.mu.Lock()
		defer rec.mu.Unlock()
		return rec.stuck > 0
	}, 10*time.Second, 5*time.Millisecond, "the health checks report that no broadcast is stuck")
	rec.mu.Lock()
	defer rec.mu.Unlock()
	for _, a := range v.Channels {
		require.True(t, rec.assigned[a.PChannel], "%s reported assigned and serving", a.PChannel)
	}
	require.Positive(t, rec.tso, "the WALs' TimeTicks were reported")
	require.Len(t, rec.broadcasts, 1)
	require.Equal(t, "CreateCollection", rec.broadcasts[0].Type)
	require.NoError(t, rec.broadcasts[0].Err)
}
