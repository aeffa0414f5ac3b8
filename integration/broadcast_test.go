package integration

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/messages"
	"github.com/streamwal/streamwal/services/wire"
)

// TestCollectionLifecycleByBroadcast: a CreateCollection broadcast to two
// shards and the CChannel makes inserts work; before it and after the
// DropCollection broadcast they are refused; the drop's callback releases
// the VChannels.
func TestCollectionLifecycleByBroadcast(t *testing.T) {
	s := startSystem(t, 1, 2)
	waitServing(t, s, true)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	nc, c := s.Conn(), s.Codec.Cluster()

	var alloc wire.AllocateReply
	require.NoError(t, call(ctx, nc, c.CoordSubject(streamwal.CoordAllocate), wire.AllocateRequest{CollectionID: 7, Shards: 2}, &alloc))
	v, err := streamwal.ParseVChannel(alloc.VChannels[0])
	require.NoError(t, err)

	insert := func(name string) error {
		m, err := s.Codec.New(messages.TypeInsert, v, []byte(name))
		require.NoError(t, err)
		_, _, err = appendOne(ctx, nc, s.Codec, m)
		return err
	}
	require.ErrorIs(t, insert("before"), streamwal.ErrLifecycle)

	ref := messages.CollectionRef{DBName: "db", CollectionName: "c7", CollectionID: 7}
	create, err := json.Marshal(messages.CreateCollectionBody{CollectionRef: ref, VChannels: alloc.VChannels})
	require.NoError(t, err)
	var created wire.BroadcastReply
	require.NoError(t, call(ctx, nc, c.CoordSubject(streamwal.CoordBroadcast), wire.BroadcastRequest{
		Type: messages.TypeCreateCollection.Name, VChannels: alloc.VChannels, DBName: "db", CollectionName: "c7",
		Payload: create, IdempotencyKey: "create-c7"}, &created))
	require.Len(t, created.Appended, 3, "two shards and the CChannel")
	require.NoError(t, insert("after-create"))

	var again wire.BroadcastReply
	require.NoError(t, call(ctx, nc, c.CoordSubject(streamwal.CoordBroadcast), wire.BroadcastRequest{
		Type: messages.TypeCreateCollection.Name, VChannels: alloc.VChannels, DBName: "db", CollectionName: "c7",
		Payload: create, IdempotencyKey: "create-c7"}, &again))
	require.Equal(t, created, again, "a retried idempotency key returns the original result")

	drop, err := json.Marshal(messages.DropCollectionBody{CollectionRef: ref})
	require.NoError(t, err)
	require.NoError(t, call(ctx, nc, c.CoordSubject(streamwal.CoordBroadcast), wire.BroadcastRequest{
		Type: messages.TypeDropCollection.Name, VChannels: alloc.VChannels, DBName: "db", CollectionName: "c7", Payload: drop}, nil))
	require.ErrorIs(t, insert("after-drop"), streamwal.ErrLifecycle)

	var dropped wire.AllocateReply
	require.NoError(t, call(ctx, nc, c.CoordSubject(streamwal.CoordAllocate), wire.AllocateRequest{CollectionID: 7, Lookup: true}, &dropped))
	require.Equal(t, wire.AllocateReply{Dropped: true}, dropped, "the drop callback released the collection")
	require.ErrorIs(t, call(ctx, nc, c.CoordSubject(streamwal.CoordAllocate), wire.AllocateRequest{CollectionID: 7, Shards: 2}, nil),
		streamwal.ErrLifecycle, "a dropped collection's ID is never allocated again")
}
