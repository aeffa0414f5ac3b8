package node_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/client"
	"github.com/streamwal/streamwal/embedded"
	"github.com/streamwal/streamwal/embedded/system"
	"github.com/streamwal/streamwal/messages"
	"github.com/streamwal/streamwal/services/coord"
	"github.com/streamwal/streamwal/services/node"
	"github.com/streamwal/streamwal/services/wire"
	"github.com/streamwal/streamwal/telemetry"
)

// recorder keeps the node events it hears.
type recorder struct {
	mu      sync.Mutex
	started int
	appends []telemetry.AppendEvent
	units   int
	opens   []telemetry.OpenEvent
	closes  []telemetry.CloseEvent
	beats   int
	// clientMsgs and clientFailed add up the client's requests.
	clientMsgs, clientFailed int
}

func (r *recorder) OnClientRequest(e telemetry.ClientRequestEvent) {
	r.with(func() { r.clientMsgs += e.Messages; r.clientFailed += e.Failed })
}

func (r *recorder) OnAppendStart(e telemetry.AppendStartEvent) {
	r.with(func() { r.started += e.Messages })
}
func (r *recorder) OnAppend(e telemetry.AppendEvent) {
	r.with(func() { r.appends = append(r.appends, e) })
}
func (r *recorder) OnUnit(e telemetry.UnitEvent)         { r.with(func() { r.units += e.Messages }) }
func (r *recorder) OnOpen(e telemetry.OpenEvent)         { r.with(func() { r.opens = append(r.opens, e) }) }
func (r *recorder) OnClose(e telemetry.CloseEvent)       { r.with(func() { r.closes = append(r.closes, e) }) }
func (r *recorder) OnHeartbeat(telemetry.HeartbeatEvent) { r.with(func() { r.beats++ }) }

func (r *recorder) with(f func()) {
	r.mu.Lock()
	defer r.mu.Unlock()
	f()
}

// TestNodeHooksAndReadiness: a node reports its opens, every message of
// an append request (by type and result), its writers' units, its
// heartbeats and, at shutdown, its closes; it is ready once it serves
// what it was assigned.
func TestNodeHooksAndReadiness(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rec := &recorder{}
	sys, err := system.Start(ctx, system.Options{Cluster: "hooks", ServerOptions: embedded.Options{StoreDir: t.TempDir()},
		Coord: coord.Config{PChannels: 2}, Node: node.Config{Hooks: telemetry.Hooks{rec}}})
	require.NoError(t, err)
	defer sys.Close()
	_, err = sys.WaitServing(ctx, false)
	require.NoError(t, err)
	n := sys.Nodes()[0]
	require.Eventually(t, func() bool { return n.Ready() == nil }, 30*time.Second, 10*time.Millisecond,
		"ready once it heard the coordinator's view of what it serves")

	c, err := client.Connect(sys.Server.ClientURL(), client.WithCluster("hooks"), client.WithoutLocalBypass(), client.WithHooks(rec))
	require.NoError(t, err)
	defer c.Close()
	vs, err := c.CreateCollection(ctx, client.Collection{DBName: "db", Name: "hooks", ID: 7})
	require.NoError(t, err)
	vc := vs[0]
	p := vc.PChannel()
	good, err := sys.Codec.New(messages.TypeInsert, vc, []byte("x"))
	require.NoError(t, err)
	nm, err := sys.Codec.Encode(good)
	require.NoError(t, err)
	req := wire.AppendRequest{Messages: []wire.Message{
		{Subject: nm.Subject, Header: nm.Header, Data: nm.Data},
		{Subject: nm.Subject, Header: nm.Header, Data: nm.Data},
		{Subject: "not.a.wal.subject", Data: []byte("junk")},
	}}
	rec.with(func() { rec.started, rec.appends, rec.units = 0, nil, 0 }) // the collection's creation
	var reply wire.AppendReply
	require.NoError(t, wire.Call(ctx, sys.Conn(), sys.Codec.Cluster().AppendSubject(p), req, &reply))
	require.Len(t, reply.Results, 3)
	require.Nil(t, reply.Results[0].Error)
	require.NotNil(t, reply.Results[2].Error)

	rec.mu.Lock()
	require.Equal(t, 3, rec.started)
	require.Len(t, rec.appends, 2, "two runs: two appended inserts, one refused message")
	require.Equal(t, telemetry.AppendEvent{PChannel: p, Type: messages.TypeInsert.Name, Messages: 2, Latency: rec.appends[0].Latency}, rec.appends[0])
	require.Equal(t, 1, rec.appends[1].Messages)
	require.Equal(t, streamwal.CodeInvalidArgument, rec.appends[1].Code)
	require.GreaterOrEqual(t, rec.units, 2, "the two inserts went to JetStream")
	require.Len(t, rec.opens, 2)
	for _, o := range rec.opens {
		require.NoError(t, o.Err)
		require.Equal(t, string(n.ID()), o.Node)
	}
	require.Positive(t, rec.beats)
	rec.mu.Unlock()

	// The client reports its requests: every message of an Append.
	var batch []*messages.MutableMessage
	for range 3 {
		m, err := sys.Codec.New(messages.TypeInsert, vc, []byte("y"))
		require.NoError(t, err)
		batch = append(batch, m)
	}
	_, err = c.Append(ctx, batch...)
	require.NoError(t, err)
	rec.mu.Lock()
	require.Equal(t, 3, rec.clientMsgs)
	require.Zero(t, rec.clientFailed)
	rec.mu.Unlock()

	sys.StopNode(n.ID(), false)
	rec.mu.Lock()
	defer rec.mu.Unlock()
	require.Len(t, rec.closes, 2)
	for _, c := range rec.closes {
		require.Equal(t, telemetry.ReasonShutdown, c.Reason)
	}
}
