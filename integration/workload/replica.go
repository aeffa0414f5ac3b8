package workload

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/client"
	"github.com/streamwal/streamwal/jetstream"
	"github.com/streamwal/streamwal/messages"
)

// replicaPoll is the pause between two checks of WaitReplica.
const replicaPoll = 200 * time.Millisecond

// ReplicaConfig names the primary and the secondary a replica check
// compares (DESIGN.md §11).
type ReplicaConfig struct {
	// Primary and Secondary read each cluster's PChannels; required.
	Primary, Secondary *client.Client
	// SecondaryConn reads the secondary's streams raw; required.
	SecondaryConn *nats.Conn
}

// ReplicaReport is what a replica check found.
type ReplicaReport struct {
	// PChannels is how many PChannels were compared.
	PChannels int
	// Replicable is how many messages of the primary's log replicate, as
	// read (a committed transaction is one); Copied how many of them the
	// secondary holds, in order; Missing how many it does not hold yet
	// (its copy is a prefix of the primary's log).
	Replicable, Copied, Missing int
	// Replicas is how many replicas the secondary's streams hold (each
	// message of a transaction counted), Own how many of its own messages
	// (WAL-internal or unreplicable).
	Replicas, Own int
	// Violations are the invariants broken, one sentence each.
	Violations []string
}

// Err is nil when the check found no violation, and otherwise an error
// listing the first ones.
func (r ReplicaReport) Err() error {
	if len(r.Violations) == 0 {
		return nil
	}
	listed := r.Violations[:min(len(r.Violations), maxListed)]
	return fmt.Errorf("workload: the replica breaks %d invariants:\n  %s", len(r.Violations), strings.Join(listed, "\n  "))
}

// Converged reports whether the secondary holds the primary's whole log
// and nothing else.
func (r ReplicaReport) Converged() bool { return r.Missing == 0 && len(r.Violations) == 0 }

// String summarizes the report in one line.
func (r ReplicaReport) String() string {
	return fmt.Sprintf("%d pchannels: %d replicable messages of the primary, %d copied, %d missing; "+
		"the secondary's streams hold %d replicas and %d messages of its own; %d violations",
		r.PChannels, r.Replicable, r.Copied, r.Missing, r.Replicas, r.Own, len(r.Violations))
}

// CheckReplica compares, PChannel by PChannel (index i with index i),
// the secondary's copy with the primary's log as they are now, and
// reports every violation of:
//   - the replicas the secondary delivers (through the read pipeline:
//     TimeTick order, transactions assembled at their commit) are the
//     replicable messages the primary delivers, in the primary's order,
//     each once, with their source MessageID, TimeTick, type, VChannel
//     and payloads (a transaction's bodies all there, in order): the copy
//     is the primary's log or a prefix of it (Missing counts the rest);
//   - in the secondary's streams, read raw, every replica is of a message
//     of the primary that replicates (never a RollbackTxn, nor a message
//     of a transaction the primary does not deliver committed), and no
//     two replicas are of the same source message;
//   - every other message of the secondary's streams is its own
//     WAL-internal or unreplicable message: it took no direct write.
//
// The secondary is read before the primary, so that what the primary
// took while the check ran counts as missing, not as a violation. Its
// error says why it could not read, not what it found.
func CheckReplica(ctx context.Context, cfg ReplicaConfig) (ReplicaReport, error) {
	if cfg.Primary == nil || cfg.Secondary == nil || cfg.SecondaryConn == nil {
		return ReplicaReport{}, fmt.Errorf("%w: a replica check needs both clients and the secondary's connection", ErrInvalidConfig)
	}
	prim, err := pchannelsOf(ctx, cfg.Primary)
	if err != nil {
		return ReplicaReport{}, err
	}
	sec, err := pchannelsOf(ctx, cfg.Secondary)
	if err != nil {
		return ReplicaReport{}, err
	}
	if len(prim) != len(sec) {
		return ReplicaReport{}, fmt.Errorf("workload: the primary has %d pchannels, the secondary %d", len(prim), len(sec))
	}
	be, err := jetstream.New(cfg.SecondaryConn, cfg.Secondary.Codec(), jetstream.Options{})
	if err != nil {
		return ReplicaReport{}, fmt.Errorf("workload: reader of the secondary's streams: %w", err)
	}
	defer func() { _ = be.Close() }()
	rc := &replicaChecker{source: cfg.Primary.Cluster()}
	for i := range prim {
		if err := rc.compare(ctx, cfg, be, prim[i], sec[i]); err != nil {
			return ReplicaReport{}, err
		}
	}
	rc.report.PChannels = len(prim)
	return rc.report, nil
}

// WaitReplica checks the replica (see CheckReplica) until the secondary
// holds the primary's whole log, and returns the last report; it returns
// at the first violation (the report's Err), and with an error when ctx
// ends first.
func WaitReplica(ctx context.Context, cfg ReplicaConfig) (ReplicaReport, error) {
	for {
		rep, err := CheckReplica(ctx, cfg)
		switch {
		case err != nil && ctx.Err() != nil:
			return rep, fmt.Errorf("workload: the secondary did not converge: %w", err)
		case err != nil:
		case rep.Converged() || len(rep.Violations) > 0:
			return rep, nil
		}
		select {
		case <-ctx.Done():
			return rep, fmt.Errorf("workload: the secondary did not converge (%s; last error %v): %w", rep, err, ctx.Err())
		case <-time.After(replicaPoll):
		}
	}
}

// pchannelsOf lists c's cluster's PChannels in index order.
func pchannelsOf(ctx context.Context, c *client.Client) ([]streamwal.PChannel, error) {
	m, err := c.ReplicateMember(ctx, "")
	if err != nil {
		return nil, fmt.Errorf("workload: pchannels of %s: %w", c.Cluster(), err)
	}
	ps := make([]streamwal.PChannel, len(m.PChannels))
	for i, name := range m.PChannels {
		if ps[i], err = streamwal.ParsePChannel(name); err != nil {
			return nil, err
		}
	}
	return ps, nil
}

// replicaChecker accumulates what the reads of a replica check found.
type replicaChecker struct {
	source streamwal.Cluster
	report ReplicaReport
}

// violation records a violation.
func (rc *replicaChecker) violation(format string, args ...any) {
	rc.report.Violations = append(rc.report.Violations, fmt.Sprintf(format, args...))
}

// replicaEntry is what the check compares of a message delivered: where
// it comes from in the primary's log and what it says.
type replicaEntry struct {
	ID       messages.MessageID
	TimeTick messages.TimeTick
	Type     string
	Target   string // the VChannel's suffix (collection and shard)
	Payload  string // a transaction's: its bodies', joined by '|'
}

// String is the entry for violations.
func (e replicaEntry) String() string {
	return fmt.Sprintf("%s %d@%d on %q payload %q", e.Type, e.ID, e.TimeTick, e.Target, e.Payload)
}

// entryOf is m's entry at source position id, tt.
func entryOf(m *messages.ImmutableMessage, id messages.MessageID, tt messages.TimeTick) replicaEntry {
	e := replicaEntry{ID: id, TimeTick: tt, Type: m.Type().Name, Payload: string(m.Payload())}
	if v := m.VChannel(); !v.IsZero() {
		e.Target = v.Suffix()
	}
	if m.Type() == messages.TypeTxn {
		parts := make([]string, 0, len(m.TxnBody()))
		for _, b := range m.TxnBody() {
			parts = append(parts, string(b.Payload()))
		}
		e.Payload = strings.Join(parts, "|")
	}
	return e
}

// own reports whether m, a message without a replicate header, is one a
// cluster writes of its own, a secondary included.
func own(m *messages.ImmutableMessage) bool {
	return m.Type().Is(messages.FlagSelfControlled) || m.Unreplicable()
}

// compare checks PChannel p of the secondary against PChannel src of
// the primary.
func (rc *replicaChecker) compare(ctx context.Context, cfg ReplicaConfig, be *jetstream.JetStream, src, p streamwal.PChannel) error {
	got, err := readLog(ctx, cfg.Secondary, p)
	if err != nil {
		return err
	}
	raw, err := readRaw(ctx, be, p)
	if err != nil {
		return err
	}
	want, err := readLog(ctx, cfg.Primary, src)
	if err != nil {
		return err
	}
	sources := rc.compareLogs(p, want, got)
	rc.checkRaw(p, raw, sources)
	return nil
}

// compareLogs checks that the replicas of got (the secondary's PChannel
// p as delivered) are the replicable messages of want (the primary's),
// in order, and returns the source MessageIDs a replica may have: every
// replicable message of want and each part of its transactions.
func (rc *replicaChecker) compareLogs(p streamwal.PChannel, want, got []*messages.ImmutableMessage) map[messages.MessageID]bool {
	sources := map[messages.MessageID]bool{}
	var wantEntries []replicaEntry
	for _, m := range want {
		if m.Type() != messages.TypeTxn && (own(m) || m.Replicate() != nil) {
			continue
		}
		wantEntries = append(wantEntries, entryOf(m, m.ID(), m.TimeTick()))
		for _, part := range parts(m) {
			sources[part.ID()] = true
		}
	}
	rc.report.Replicable += len(wantEntries)
	n := 0
	for _, m := range got {
		h := m.Replicate()
		switch {
		case h == nil && own(m):
			continue
		case h == nil:
			rc.violation("%s: %s %d@%d is not a replica: a direct write on the secondary", p, m.Type(), m.ID(), m.TimeTick())
			continue
		case h.Cluster != rc.source:
			rc.violation("%s: %s %d is a replica of %s, not of the primary %s", p, m.Type(), m.ID(), h.Cluster, rc.source)
			continue
		}
		e := entryOf(m, h.MessageID, h.TimeTick)
		switch {
		case n >= len(wantEntries):
			rc.violation("%s: replica %d (%s) after the primary's last replicable message", p, m.ID(), e)
		case e != wantEntries[n]:
			rc.violation("%s: replica %d of the copy is %d (%s), the primary's message there is %s", p, n, m.ID(), e, wantEntries[n])
		}
		n++
	}
	rc.report.Copied += min(n, len(wantEntries))
	rc.report.Missing += max(len(wantEntries)-n, 0)
	return sources
}

// parts are the messages of m a replica may be of: m, or a transaction's
// begin, bodies and commit.
func parts(m *messages.ImmutableMessage) []*messages.ImmutableMessage {
	if m.Type() != messages.TypeTxn {
		return []*messages.ImmutableMessage{m}
	}
	return append(append([]*messages.ImmutableMessage{m.TxnBegin()}, m.TxnBody()...), m.TxnCommit())
}

// checkRaw checks the secondary's stream of p, read raw: every replica
// of a source message in sources, once; every other message its own.
func (rc *replicaChecker) checkRaw(p streamwal.PChannel, raw []*messages.ImmutableMessage, sources map[messages.MessageID]bool) {
	seen := map[messages.MessageID]messages.MessageID{} // source MessageID -> the replica's
	for _, m := range raw {
		h := m.Replicate()
		switch {
		case h == nil && own(m):
			rc.report.Own++
		case h == nil:
			rc.violation("%s stream: %s %d is not a replica: a direct write on the secondary", p, m.Type(), m.ID())
		case m.Type() == messages.TypeRollbackTxn:
			rc.violation("%s stream: %d is a replica of RollbackTxn %d", p, m.ID(), h.MessageID)
		case h.Cluster != rc.source:
			rc.violation("%s stream: %s %d is a replica of %s, not of the primary %s", p, m.Type(), m.ID(), h.Cluster, rc.source)
		case seen[h.MessageID] != 0:
			rc.violation("%s stream: %s %d and %d are both replicas of message %d", p, m.Type(), seen[h.MessageID], m.ID(), h.MessageID)
		default:
			rc.report.Replicas++
			seen[h.MessageID] = m.ID()
			if !sources[h.MessageID] {
				rc.violation("%s stream: %s %d is a replica of message %d, which the primary does not deliver (rolled back, expired or not replicable)",
					p, m.Type(), m.ID(), h.MessageID)
			}
		}
	}
}

// readLog reads PChannel p through c, from its first message through its
// tail as of now (every type but the WAL's ticks and barriers,
// transactions assembled).
func readLog(ctx context.Context, c *client.Client, p streamwal.PChannel) ([]*messages.ImmutableMessage, error) {
	sc, err := c.Read(ctx, client.ReadOptions{PChannel: p, Start: client.Earliest(), UntilNow: true})
	if err != nil {
		return nil, fmt.Errorf("workload: read %s of %s: %w", p, c.Cluster(), err)
	}
	defer func() { _ = sc.Close() }()
	var out []*messages.ImmutableMessage
	for {
		m, err := sc.Next(ctx)
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("workload: read %s of %s after %d messages: %w", p, c.Cluster(), len(out), err)
		}
		out = append(out, m)
	}
}

// readRaw reads p's stream raw from its start through its last message
// as of now.
func readRaw(ctx context.Context, be *jetstream.JetStream, p streamwal.PChannel) ([]*messages.ImmutableMessage, error) {
	st, err := be.State(ctx, p)
	if err != nil {
		return nil, fmt.Errorf("workload: state of %s: %w", p, err)
	}
	if st.Last == 0 {
		return nil, nil
	}
	sc, err := be.Read(ctx, p, jetstream.ReadOptions{Start: jetstream.Earliest()})
	if err != nil {
		return nil, fmt.Errorf("workload: read the stream of %s: %w", p, err)
	}
	defer func() { _ = sc.Close() }()
	var out []*messages.ImmutableMessage
	for m, err := range sc.All(ctx) {
		if err != nil {
			return nil, fmt.Errorf("workload: read the stream of %s through %d: %w", p, st.Last, err)
		}
		out = append(out, m)
		if m.ID() >= st.Last {
			return out, nil
		}
	}
	return nil, fmt.Errorf("workload: read of the stream of %s ended before %d", p, st.Last)
}
