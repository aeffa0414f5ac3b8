package node

import (
	"sync"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/services/node/wal"
)

// local holds the WALs served by the nodes of this process, by cluster and
// PChannel, for the client's local bypass.
var local sync.Map // localKey -> *wal.WAL

// localKey identifies a PChannel of a cluster.
type localKey struct {
	cluster  streamwal.Cluster
	pchannel streamwal.PChannel
}

// Local returns the WAL of p if a node of this process serves it, so that
// an in-process client appends to it directly, with the same semantics as
// through the append subject.
func Local(c streamwal.Cluster, p streamwal.PChannel) (*wal.WAL, bool) {
	w, ok := local.Load(localKey{c, p})
	if !ok {
		return nil, false
	}
	return w.(*wal.WAL), true
}

// publishLocal registers w as served in this process.
func publishLocal(c streamwal.Cluster, w *wal.WAL) {
	local.Store(localKey{c, w.PChannel()}, w)
}

// withdrawLocal unregisters w if it is still the one registered.
func withdrawLocal(c streamwal.Cluster, w *wal.WAL) {
	local.CompareAndDelete(localKey{c, w.PChannel()}, w)
}
