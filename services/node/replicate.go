package node

import (
	"context"

	"github.com/streamwal/streamwal/services/node/wal"
	"github.com/streamwal/streamwal/services/replicate"
)

// replicate runs the replicator of w's PChannel (see package replicate:
// it replicates while the topology in w's log makes this cluster a
// secondary) until w stops serving or the node stops; so a PChannel's
// replicator moves with the PChannel.
func (n *Node) replicate(w *wal.WAL) {
	defer n.loops.Done()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		defer cancel()
		select {
		case <-w.Done():
		case <-n.stop:
		case <-ctx.Done():
		}
	}()
	err := replicate.Run(ctx, replicate.Config{Target: w, Codec: n.cfg.Codec, Local: n.cfg.Conn,
		Collections: replicate.Coordinator(n.cfg.Conn, n.cfg.Codec.Cluster()), SourceOptions: n.cfg.ReplicateOptions, Logger: n.log, Hooks: n.cfg.Hooks})
	if err != nil {
		n.log.Error().Err(err).Str("pchannel", w.PChannel().String()).Msg("replicator")
	}
}
