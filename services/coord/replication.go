package coord

import (
	"context"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/messages"
	"github.com/streamwal/streamwal/services/coord/broadcast"
)

// The replication topology (DESIGN.md §1, §11). An AlterReplicateConfig
// is checked before its broadcast starts, so that a topology this cluster
// cannot take (not a star, not naming this cluster, another PChannel
// count, older than the cluster's: messages.Topology.OlderThan) changes
// nothing; once it landed on every PChannel, its callback records it as
// the cluster's topology in the replication bucket, where clients and
// operators read it (`nats kv get wal_<c>_replication topology`), unless
// a newer one was recorded meanwhile. The WALs take their role from the
// message in their own log, not from the bucket.

// checkReplicateConfig refuses an AlterReplicateConfig whose topology
// this cluster cannot take.
func (t *tenure) checkReplicateConfig(ctx context.Context, payload []byte) error {
	var topo messages.Topology
	if err := jsonDecode(payload, &topo); err != nil {
		return err
	}
	if err := topo.CheckFor(t.c.cfg.Cluster, t.ctl.names); err != nil {
		return err
	}
	cur, ok, err := t.topology(ctx)
	if err != nil {
		return err
	}
	if ok && topo.OlderThan(cur) {
		return streamwal.Errorf(streamwal.CodeInvalidArgument, "replication topology version %d is older than cluster %s's, version %d",
			topo.Version, t.c.cfg.Cluster, cur.Version)
	}
	return nil
}

// topology reads the topology recorded in the replication bucket (ok
// false: none).
func (t *tenure) topology(ctx context.Context) (topo messages.Topology, ok bool, err error) {
	ok, err = newStore(t.c.buckets[streamwal.BucketReplication]).load(ctx, streamwal.KeyReplicateTopology, &topo)
	return topo, ok, err
}

// replicateConfigured is AlterReplicateConfig's callback: the topology
// becomes the cluster's, unless a newer one already is.
func (t *tenure) replicateConfigured(ctx context.Context, task *broadcast.Task) error {
	var topo messages.Topology
	if err := jsonDecode(task.Payload, &topo); err != nil {
		return err
	}
	s := newStore(t.c.buckets[streamwal.BucketReplication])
	var cur messages.Topology
	found, err := s.load(ctx, streamwal.KeyReplicateTopology, &cur)
	if err != nil {
		return err
	}
	if found && topo.OlderThan(cur) {
		t.c.log.Warn().Uint64("version", topo.Version).Uint64("current", cur.Version).Msg("replication topology older than the cluster's; not recorded")
		return nil
	}
	return s.put(ctx, streamwal.KeyReplicateTopology, topo)
}
