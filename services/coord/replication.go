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
// count) changes nothing; once it landed on every PChannel, its callback
// records it as the cluster's topology in the replication bucket, where
// clients and operators read it (`nats kv get wal_<c>_replication
// topology`). The WALs take their role from the message in their own log,
// not from the bucket.

// checkReplicateConfig refuses an AlterReplicateConfig whose topology
// this cluster cannot take.
func (t *tenure) checkReplicateConfig(payload []byte) error {
	var topo messages.Topology
	if err := jsonDecode(payload, &topo); err != nil {
		return err
	}
	return topo.CheckFor(t.c.cfg.Cluster, t.ctl.names)
}

// replicateConfigured is AlterReplicateConfig's callback: the topology
// becomes the cluster's.
func (t *tenure) replicateConfigured(ctx context.Context, task *broadcast.Task) error {
	var topo messages.Topology
	if err := jsonDecode(task.Payload, &topo); err != nil {
		return err
	}
	s := newStore(t.c.buckets[streamwal.BucketReplication])
	var cur messages.Topology
	if _, err := s.load(ctx, streamwal.KeyReplicateTopology, &cur); err != nil {
		return err
	}
	return s.put(ctx, streamwal.KeyReplicateTopology, topo)
}
