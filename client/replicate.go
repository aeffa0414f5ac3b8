package client

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"time"

	njs "github.com/nats-io/nats.go/jetstream"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/messages"
	"github.com/streamwal/streamwal/services/wire"
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
	kv, err := c.replicationKV(ctx)
	if err != nil {
		return topo, false, err
	}
	return readTopology(ctx, kv)
}

// readTopology reads the topology from the replication bucket kv.
func readTopology(ctx context.Context, kv njs.KeyValue) (topo messages.Topology, ok bool, err error) {
	e, err := kv.Get(ctx, streamwal.KeyReplicateTopology)
	if errors.Is(err, njs.ErrKeyNotFound) {
		return topo, false, nil
	}
	if err != nil {
		return topo, false, streamwal.Errorf(streamwal.CodeUnavailable, "read %s %s: %v", kv.Bucket(), streamwal.KeyReplicateTopology, err)
	}
	if err := json.Unmarshal(e.Value(), &topo); err != nil {
		return topo, false, streamwal.Errorf(streamwal.CodeUnrecoverable, "decode %s %s: %v", kv.Bucket(), streamwal.KeyReplicateTopology, err)
	}
	return topo, true, nil
}

// ReplicationStatus is a cluster's replication as its replication bucket
// records it.
type ReplicationStatus struct {
	// Topology is the cluster's topology (Configured false: none).
	Topology   messages.Topology `json:"topology"`
	Configured bool              `json:"configured"`
	// Role is the cluster's role in it.
	Role messages.ReplicateRole `json:"role"`
	// Channels are the replicate checkpoints of a secondary's PChannels,
	// by PChannel name order.
	Channels []ReplicationChannel `json:"channels,omitempty"`
}

// ReplicationChannel is where the replicator of one PChannel of a
// secondary stands.
type ReplicationChannel struct {
	PChannel string `json:"pchannel"`
	// Source is the cluster replicated from, SourcePChannel its PChannel.
	Source         streamwal.Cluster `json:"source"`
	SourcePChannel string            `json:"source_pchannel"`
	// MessageID, TimeTick and LastConfirmed: the last message of the
	// source replicated (or skipped), with everything before it.
	MessageID     messages.MessageID `json:"message_id"`
	TimeTick      messages.TimeTick  `json:"timetick"`
	LastConfirmed messages.MessageID `json:"last_confirmed"`
	// Through: the secondary holds everything of the source up to this
	// TimeTick; SourceTimeTick: the source's latest TimeTick known.
	Through        messages.TimeTick `json:"through"`
	SourceTimeTick messages.TimeTick `json:"source_timetick"`
	// Lag is the time since Through, as of the read (LagKnown false
	// before anything was replicated): it grows while replication is
	// stuck, disconnected or not running.
	Lag      time.Duration `json:"lag"`
	LagKnown bool          `json:"lag_known"`
	// Replicated counts the units the current replicator appended.
	Replicated uint64 `json:"replicated"`
	// Error is why replication does not progress, if it does not.
	Error string `json:"error,omitempty"`
	// Updated is when the replicator last wrote the record.
	Updated time.Time `json:"updated"`
	// Old says that the record is of a source this cluster does not
	// replicate from in the topology in force (a primary's records, or a
	// secondary's of its source before a failover or switchover, until
	// its replicator records the new one): what it held of that source,
	// not where replication stands; its lag is not known.
	Old bool `json:"old,omitempty"`
}

// ReplicationStatus reads the cluster's topology and, on a secondary,
// every PChannel's replicate checkpoint, with its lag as of now.
func (c *Client) ReplicationStatus(ctx context.Context) (ReplicationStatus, error) {
	var st ReplicationStatus
	kv, err := c.replicationKV(ctx)
	if err != nil {
		return st, err
	}
	if st.Topology, st.Configured, err = readTopology(ctx, kv); err != nil {
		return st, err
	}
	st.Role = st.Topology.Role(c.opts.cluster)
	if !st.Configured {
		return st, nil
	}
	m, _ := st.Topology.Member(c.opts.cluster)
	src, _ := st.Topology.Source(c.opts.cluster)
	now := time.Now()
	for _, name := range m.PChannels {
		p, err := streamwal.ParsePChannel(name)
		if err != nil {
			return st, err
		}
		e, err := kv.Get(ctx, streamwal.ReplicateCheckpointKey(p))
		if errors.Is(err, njs.ErrKeyNotFound) {
			if st.Role == messages.RoleSecondary {
				st.Channels = append(st.Channels, ReplicationChannel{PChannel: name, Error: "no replicator has reported yet"})
			}
			continue
		}
		if err != nil {
			return st, streamwal.Errorf(streamwal.CodeUnavailable, "read the replicate checkpoint of %s: %v", name, err)
		}
		var rec wire.ReplicateCheckpoint
		if err := json.Unmarshal(e.Value(), &rec); err != nil {
			return st, streamwal.Errorf(streamwal.CodeUnrecoverable, "decode the replicate checkpoint of %s: %v", name, err)
		}
		ch := ReplicationChannel{PChannel: name, Source: rec.Source, SourcePChannel: rec.SourcePChannel, MessageID: rec.MessageID,
			TimeTick: rec.TimeTick, LastConfirmed: rec.LastConfirmed, Through: rec.Through, SourceTimeTick: rec.SourceTimeTick,
			Replicated: rec.Replicated, Error: rec.Error, Updated: rec.Updated}
		ch.Lag, ch.LagKnown = rec.Lag(now)
		if ch.Old = st.Role != messages.RoleSecondary || rec.Source != src.Cluster; ch.Old {
			ch.Lag, ch.LagKnown = 0, false
		}
		st.Channels = append(st.Channels, ch)
	}
	return st, nil
}

// replicationKV opens the cluster's replication bucket.
func (c *Client) replicationKV(ctx context.Context) (njs.KeyValue, error) {
	js, err := njs.New(c.nc)
	if err != nil {
		return nil, streamwal.Errorf(streamwal.CodeUnavailable, "jetstream: %v", err)
	}
	name := c.opts.cluster.BucketName(streamwal.BucketReplication)
	kv, err := js.KeyValue(ctx, name)
	if err != nil {
		return nil, streamwal.Errorf(streamwal.CodeUnavailable, "open bucket %s: %v", name, err)
	}
	return kv, nil
}
