package node

import (
	"context"
	"sync"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/messages"
	"github.com/streamwal/streamwal/services/node/wal"
)

// localWALs holds the WALs a node serves, by PChannel, for the local
// bypass of a client in the same process (see AppendLocal). It belongs to
// one node: nothing is registered process-wide.
type localWALs struct {
	m sync.Map // streamwal.PChannel -> *wal.WAL
}

// publish registers w as served by the node.
func (l *localWALs) publish(w *wal.WAL) { l.m.Store(w.PChannel(), w) }

// withdraw unregisters w if it is still the one registered.
func (l *localWALs) withdraw(w *wal.WAL) { l.m.CompareAndDelete(w.PChannel(), w) }

// get returns the WAL served for p.
func (l *localWALs) get(p streamwal.PChannel) (*wal.WAL, bool) {
	w, ok := l.m.Load(p)
	if !ok {
		return nil, false
	}
	return w.(*wal.WAL), true
}

// AppendLocal appends msgs to p directly when n serves p of cluster c,
// with the semantics and errors of an append request (each message
// succeeds or fails on its own); served is false, and nothing is
// appended, when it does not. It is the local bypass of a client in the
// same process (client.Local, provided by embedded/system). It is
// admitted as an append request is (see AdmissionOptions).
func (n *Node) AppendLocal(ctx context.Context, c streamwal.Cluster, p streamwal.PChannel, msgs []*messages.MutableMessage) (out []*messages.ImmutableMessage, errs []error, served bool) {
	if c != n.cfg.Codec.Cluster() {
		return nil, nil, false
	}
	w, ok := n.local.get(p)
	if !ok {
		return nil, nil, false
	}
	weight := localWeight(msgs)
	if err := n.admitAppend(ctx, p, weight); err != nil {
		errs = make([]error, len(msgs))
		for i := range errs {
			errs[i] = err
		}
		return make([]*messages.ImmutableMessage, len(msgs)), errs, true
	}
	defer n.admission.Release(p, weight)
	tr := n.traceAppend(msgs, func(i int) map[string][]string { return traceHeader(msgs[i]) })
	out, errs = w.AppendMany(ctx, msgs)
	tr.end(out, errs)
	return out, errs, true
}
