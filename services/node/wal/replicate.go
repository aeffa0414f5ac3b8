package wal

import (
	"context"
	"encoding/json"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/messages"
)

// replication is what the WAL knows of replication from its log.
type replication struct {
	// Topology is the topology of the last AlterReplicateConfig (nil:
	// none yet).
	Topology *messages.Topology `json:"topology,omitempty"`
	// Source is the replicate header of the replica with the highest
	// source TimeTick that landed (nil: none).
	Source *messages.ReplicateHeader `json:"source,omitempty"`
}

// apply takes one message of the log, in log order. A topology older
// than the one in force (messages.Topology.OlderThan) changes nothing:
// it arrived late, and a newer change already holds.
func (r *replication) apply(m *messages.ImmutableMessage) error {
	if m.Type() == messages.TypeAlterReplicateConfig {
		var topo messages.Topology
		if err := m.Body(&topo); err != nil {
			return err
		}
		if r.Topology == nil || !topo.OlderThan(*r.Topology) {
			r.Topology = &topo
		}
		return nil
	}
	if h := m.Replicate(); h != nil {
		r.advance(h)
	}
	return nil
}

// advance records a replica that landed.
func (r *replication) advance(h *messages.ReplicateHeader) {
	if r.Source == nil || r.Source.Cluster != h.Cluster || h.TimeTick > r.Source.TimeTick {
		c := *h
		r.Source = &c
	}
}

// role is the role of cluster c, and its source when it is a secondary;
// handover names the secondary a primary hands its role over to during
// a switchover ("" otherwise).
func (r *replication) role(c streamwal.Cluster) (role messages.ReplicateRole, src messages.ReplicateMember, handover streamwal.Cluster) {
	if r.Topology == nil {
		return messages.RolePrimary, messages.ReplicateMember{}, ""
	}
	src, ok := r.Topology.Source(c)
	if !ok {
		if r.Topology.Primary == c {
			handover = r.Topology.Handover
		}
		return messages.RolePrimary, src, handover
	}
	return messages.RoleSecondary, src, ""
}

// clone is a deep copy.
func (r replication) clone() replication {
	if r.Topology != nil {
		t := r.Topology.Clone()
		r.Topology = &t
	}
	if r.Source != nil {
		s := *r.Source
		r.Source = &s
	}
	return r
}

// encode is the state as the recovery checkpoint keeps it (nil when
// there is nothing to keep).
func (r replication) encode() json.RawMessage {
	if r.Topology == nil && r.Source == nil {
		return nil
	}
	data, err := json.Marshal(r)
	if err != nil {
		return nil
	}
	return data
}

// decodeReplication reads the state a recovery checkpoint kept.
func decodeReplication(data json.RawMessage) (replication, error) {
	var r replication
	if len(data) == 0 {
		return r, nil
	}
	if err := json.Unmarshal(data, &r); err != nil {
		return r, streamwal.Errorf(streamwal.CodeUnrecoverable, "replication state of the checkpoint: %v", err)
	}
	return r, nil
}

// inflightReplicas tracks the replicas stamped whose outcome is not known
// yet: how many, and the highest source TimeTick among them.
type inflightReplicas struct {
	count int
	high  messages.TimeTick
}

// replicateInterceptor enforces the cluster's role and deduplicates
// replicas.
type replicateInterceptor struct{}

func (replicateInterceptor) admit(context.Context, *WAL, *appendOp) error { return nil }

func (replicateInterceptor) stamp(w *WAL, op *appendOp) error {
	if op.internal {
		return nil
	}
	self := w.codec.Cluster()
	role, src, handover := w.repl.role(self)
	for _, m := range op.msgs {
		if err := checkRole(self, role, src, op, m); err != nil {
			return err
		}
		if err := checkHandover(self, handover, m); err != nil {
			return err
		}
	}
	key, ok := replicaKey(op)
	if !ok {
		return nil
	}
	if key == 0 {
		return streamwal.Errorf(streamwal.CodeInvalidArgument, "replica of %s without a source timetick", src.Cluster)
	}
	if s := w.repl.Source; s != nil && s.Cluster == src.Cluster && key <= s.TimeTick {
		return streamwal.Errorf(streamwal.CodeDuplicate, "replica of %s at source timetick %s: the replica of source timetick %s landed already", src.Cluster, key, s.TimeTick)
	}
	if w.replicas.count > 0 && key <= w.replicas.high {
		return streamwal.Errorf(streamwal.CodeUnavailable, "replica of %s at source timetick %s: one at source timetick %s is in flight", src.Cluster, key, w.replicas.high)
	}
	w.replicas.count++
	w.replicas.high = max(w.replicas.high, key)
	op.replica = key
	return nil
}

// checkRole refuses m if the cluster's role forbids it.
func checkRole(self streamwal.Cluster, role messages.ReplicateRole, src messages.ReplicateMember, op *appendOp, m *messages.MutableMessage) error {
	h := m.Replicate()
	switch {
	case h == nil && (m.Unreplicable() || role != messages.RoleSecondary):
		return nil
	case h == nil:
		return streamwal.NotPrimary(self, src.Cluster, "%s on %s: a secondary takes only replicas of its primary", m.Type(), target(m))
	case m.Unreplicable():
		return streamwal.Errorf(streamwal.CodeInvalidArgument, "%s on %s is unreplicable but carries a replicate header", m.Type(), target(m))
	case role != messages.RoleSecondary:
		return streamwal.Errorf(streamwal.CodeNotSecondary, "replica of %s refused: cluster %s is a primary and takes no replica", h.Cluster, self)
	case h.Cluster != src.Cluster:
		return streamwal.Errorf(streamwal.CodeNotSecondary, "replica of %s refused: cluster %s is a secondary of %s", h.Cluster, self, src.Cluster)
	case !op.whole && (m.Txn() != nil || m.Type().Is(messages.FlagTxnControl)):
		return streamwal.Errorf(streamwal.CodeInvalidArgument, "%s replica of %s on %s: a replicated transaction is appended whole", m.Type(), h.Cluster, target(m))
	}
	return nil
}

// checkHandover refuses a direct write to a primary that hands its role
// over to another cluster (a switchover in progress): the error names
// the cluster that takes over, where the writer goes on.
func checkHandover(self, handover streamwal.Cluster, m *messages.MutableMessage) error {
	if handover == "" || m.Replicate() != nil || m.Unreplicable() {
		return nil
	}
	return streamwal.NotPrimary(self, handover, "%s on %s: cluster %s is handing its primary role over to %s (switchover)", m.Type(), target(m), self, handover)
}

// target names where m goes, for errors.
func target(m *messages.MutableMessage) string {
	if v := m.VChannel(); !v.IsZero() {
		return v.String()
	}
	return m.PChannel().String()
}

// replicaKey is the source TimeTick that deduplicates op, if op is a
// replica: its last message's (a whole transaction's CommitTxn).
func replicaKey(op *appendOp) (messages.TimeTick, bool) {
	h := op.msgs[len(op.msgs)-1].Replicate()
	if h == nil {
		return 0, false
	}
	return h.TimeTick, true
}

func (replicateInterceptor) finish(w *WAL, op *appendOp, index int) {
	if op.stamped <= index {
		return
	}
	if op.replica != 0 {
		w.replicas.count--
		if op.outcome == landed {
			w.repl.advance(op.msgs[len(op.msgs)-1].Replicate())
		}
		if w.replicas.count == 0 {
			w.replicas.high = 0
		}
	}
	m := op.msgs[0]
	if m.Type() != messages.TypeAlterReplicateConfig {
		return
	}
	switch op.outcome {
	case landed:
		before := w.repl.Topology
		if err := w.repl.apply(m.Freeze(op.ids[0])); err != nil {
			w.failLocked(streamwal.Errorf(streamwal.CodeUnrecoverable, "%s landed at %d but cannot be applied: %w", m.Type(), op.ids[0], err))
			return
		}
		if w.repl.Topology != before {
			w.topologyChangedLocked()
		}
	case unknown:
		w.failLocked(streamwal.Errorf(streamwal.CodeUnrecoverable, "outcome of %s on %s is unknown; reopen the wal to learn it", m.Type(), m.PChannel()))
	}
}

// topologyChangedLocked wakes those waiting for a change of the topology
// (under w.mu).
func (w *WAL) topologyChangedLocked() {
	close(w.topoChanged)
	w.topoChanged = make(chan struct{})
}

// Replication is the WAL's view of replication: the topology of the last
// AlterReplicateConfig that landed (ok is false when none did), the
// position in the source's log of the last replica that landed (nil when
// none did), and a channel closed at the next change of the topology.
func (w *WAL) Replication() (topo messages.Topology, ok bool, source *messages.ReplicateHeader, changed <-chan struct{}) {
	w.mu.Lock()
	defer w.mu.Unlock()
	r := w.repl.clone()
	if r.Topology != nil {
		topo, ok = *r.Topology, true
	}
	return topo, ok, r.Source, w.topoChanged
}
