package client

import (
	"context"
	"encoding/json"
	"errors"
	"slices"

	njs "github.com/nats-io/nats.go/jetstream"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/messages"
)

// ReplicateMember describes the client's cluster as a member of a
// replication topology reached at url: its name and its PChannels in
// index order, as its coordinator lists them.
func (c *Client) ReplicateMember(ctx context.Context, url string) (messages.ReplicateMember, error) {
	v, err := c.View(ctx)
	if err != nil {
		return messages.ReplicateMember{}, err
	}
	ps := make([]streamwal.PChannel, 0, len(v.Channels))
	for _, a := range v.Channels {
		p, err := streamwal.ParsePChannel(a.PChannel)
		if err != nil {
			return messages.ReplicateMember{}, err
		}
		ps = append(ps, p)
	}
	slices.SortFunc(ps, func(a, b streamwal.PChannel) int { return a.Index() - b.Index() })
	m := messages.ReplicateMember{Cluster: c.opts.cluster, URL: url}
	for _, p := range ps {
		m.PChannels = append(m.PChannels, p.String())
	}
	return m, nil
}

// ConfigureReplication sets the replication topology of the client's
// cluster (DESIGN.md §11): an AlterReplicateConfig broadcast to every
// PChannel, which each WAL takes its role from. Every member cluster is
// configured on its own, with the same topology. A topology that is not
// a star, that does not name this cluster, or whose PChannel counts
// differ (streamwal.ErrPChannelCountMismatch) is refused and changes
// nothing.
func (c *Client) ConfigureReplication(ctx context.Context, topo messages.Topology) (BroadcastResult, error) {
	if err := topo.Validate(); err != nil {
		return BroadcastResult{}, err
	}
	return c.Broadcast(ctx, BroadcastRequest{Type: messages.TypeAlterReplicateConfig, Body: topo})
}

// ReplicationTopology reads the cluster's replication topology as of the
// last AlterReplicateConfig that landed on every PChannel; ok is false
// when the cluster was never configured.
func (c *Client) ReplicationTopology(ctx context.Context) (topo messages.Topology, ok bool, err error) {
	js, err := njs.New(c.nc)
	if err != nil {
		return topo, false, streamwal.Errorf(streamwal.CodeUnavailable, "jetstream: %v", err)
	}
	name := c.opts.cluster.BucketName(streamwal.BucketReplication)
	kv, err := js.KeyValue(ctx, name)
	if err != nil {
		return topo, false, streamwal.Errorf(streamwal.CodeUnavailable, "open bucket %s: %v", name, err)
	}
	e, err := kv.Get(ctx, streamwal.KeyReplicateTopology)
	if errors.Is(err, njs.ErrKeyNotFound) {
		return topo, false, nil
	}
	if err != nil {
		return topo, false, streamwal.Errorf(streamwal.CodeUnavailable, "read %s %s: %v", name, streamwal.KeyReplicateTopology, err)
	}
	if err := json.Unmarshal(e.Value(), &topo); err != nil {
		return topo, false, streamwal.Errorf(streamwal.CodeUnrecoverable, "decode %s %s: %v", name, streamwal.KeyReplicateTopology, err)
	}
	return topo, true, nil
}
