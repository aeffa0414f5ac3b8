package workload

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/client"
	"github.com/streamwal/streamwal/jetstream"
	"github.com/streamwal/streamwal/messages"
)

// maxListed bounds the violations Report.Err lists.
const maxListed = 20

// PlainCounts count the plain appends of a load by outcome.
type PlainCounts struct {
	Acknowledged int
	Unknown      int
	// UnknownLanded is how many appends of unknown outcome were read back.
	UnknownLanded int
	Refused       int
}

// TxnCounts count the transactions of a load by outcome.
type TxnCounts struct {
	Committed     int
	RolledBack    int
	Aborted       int
	CommitUnknown int
	// CommitUnknownLanded is how many of unknown commit were read back.
	CommitUnknownLanded int
}

// Report is what a check found.
type Report struct {
	Plain PlainCounts
	Txns  TxnCounts
	// Errors counts the errors the load was told, by code ("" for
	// untyped ones).
	Errors map[streamwal.Code]int
	// VChannelMessages is how many inserts and Txns the reads of the
	// VChannels delivered; StreamMessages how many messages the raw reads
	// of the PChannels' streams delivered, Barriers how many of them were
	// RecoveryBarriers.
	VChannelMessages int
	StreamMessages   int
	Barriers         int
	// BarriersBehind are the RecoveryBarriers whose TimeTick was not above
	// every one before them in their stream, one sentence each, when
	// Config.TolerateBarrierBehind counts them here rather than in
	// Violations.
	BarriersBehind []string
	// Violations are the invariants broken, one sentence each.
	Violations []string
}

// Err is nil when the check found no violation, and otherwise an error
// listing the first ones.
func (r Report) Err() error {
	if len(r.Violations) == 0 {
		return nil
	}
	listed := r.Violations[:min(len(r.Violations), maxListed)]
	return fmt.Errorf("workload: %d violations:\n  %s", len(r.Violations), strings.Join(listed, "\n  "))
}

// String summarizes the report in one line.
func (r Report) String() string {
	return fmt.Sprintf("plain appends: %d acknowledged, %d of unknown outcome (%d landed), %d refused; "+
		"transactions: %d committed, %d rolled back, %d aborted, %d of unknown commit (%d landed); "+
		"read %d messages of the VChannels, %d of the streams (%d barriers, %d tolerated behind); errors by code %v; %d violations",
		r.Plain.Acknowledged, r.Plain.Unknown, r.Plain.UnknownLanded, r.Plain.Refused,
		r.Txns.Committed, r.Txns.RolledBack, r.Txns.Aborted, r.Txns.CommitUnknown, r.Txns.CommitUnknownLanded,
		r.VChannelMessages, r.StreamMessages, r.Barriers, len(r.BarriersBehind), r.Errors, len(r.Violations))
}

// Check seals the load (see Seal) and verifies it (see Verify). Call it
// after Stop.
func (l *Load) Check(ctx context.Context) (Report, error) {
	if err := l.Seal(ctx); err != nil {
		return Report{}, err
	}
	return l.Verify(ctx)
}

// Seal appends an end mark, an insert, to every VChannel of the load,
// each retried with a fresh payload until one is acknowledged or ctx
// ends; Verify reads each VChannel through its end mark. Call it after
// Stop, once the cluster is expected to take writes.
func (l *Load) Seal(ctx context.Context) error {
	if !l.stopped() {
		return errors.New("workload: seal of a load that runs: stop it first")
	}
	marks := map[streamwal.VChannel]string{}
	for _, v := range l.cfg.VChannels {
		mark, err := l.appendUntilAcked(ctx, v, "end-"+v.String())
		if err != nil {
			return fmt.Errorf("workload: seal: %w", err)
		}
		marks[v] = mark
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.marks = marks
	return nil
}

// Verify reads back what the load appended (see the package doc) and
// reports every violation of the invariants; its error says why it could
// not read (a VChannel that ends before its end mark within ctx, a
// stream that cannot be read), not what it found. Call it after Seal.
func (l *Load) Verify(ctx context.Context) (Report, error) {
	l.mu.Lock()
	marks := l.marks
	l.mu.Unlock()
	if marks == nil {
		return Report{}, errors.New("workload: verify before seal")
	}
	c := &checker{snap: l.ledger.snapshot(), plainSeen: map[string]int{}, txnSeen: map[txnKey]int{},
		tolerateBarrier: l.cfg.TolerateBarrierBehind}
	for _, v := range l.cfg.VChannels {
		if err := c.readVChannel(ctx, l.cfg.Client, v, marks[v]); err != nil {
			return Report{}, err
		}
	}
	be, err := jetstream.New(l.cfg.Conn, l.cfg.Client.Codec(), jetstream.Options{Archive: true})
	if err != nil {
		return Report{}, fmt.Errorf("workload: reader of the streams: %w", err)
	}
	defer func() { _ = be.Close() }()
	for _, p := range l.PChannels() {
		if err := c.readStream(ctx, be, p); err != nil {
			return Report{}, err
		}
	}
	c.tally()
	c.report.Errors = l.ledger.Errors()
	return c.report, nil
}

// checker accumulates what the reads found.
type checker struct {
	snap            snapshot
	tolerateBarrier bool
	plainSeen       map[string]int
	txnSeen         map[txnKey]int
	report          Report
}

// violation records a violation.
func (c *checker) violation(format string, args ...any) {
	c.report.Violations = append(c.report.Violations, fmt.Sprintf(format, args...))
}

// readVChannel reads v from its start through the insert whose payload
// is mark, checking each message.
func (c *checker) readVChannel(ctx context.Context, cl *client.Client, v streamwal.VChannel, mark string) error {
	s, err := cl.Read(ctx, client.ReadOptions{VChannel: v, Start: client.Earliest()})
	if err != nil {
		return fmt.Errorf("workload: read %s: %w", v, err)
	}
	defer func() { _ = s.Close() }()
	var prev *messages.ImmutableMessage
	n := 0
	for m, err := range s.All(ctx) {
		if err != nil {
			return fmt.Errorf("workload: read %s after %d messages, before its end mark %s: %w", v, n, mark, err)
		}
		n++
		if !m.VChannel().IsZero() && m.VChannel() != v {
			c.violation("%s: the read delivered %s %d of %s", v, m.Type(), m.ID(), m.VChannel())
		}
		if prev != nil {
			c.checkOrder(v.String(), prev, m)
		}
		prev = m
		switch m.Type() {
		case messages.TypeInsert:
			c.report.VChannelMessages++
			c.insert(v, m)
			if string(m.Payload()) == mark {
				return nil
			}
		case messages.TypeTxn:
			c.report.VChannelMessages++
			c.txn(v, m)
		}
	}
	return fmt.Errorf("workload: read of %s ended after %d messages, before its end mark %s", v, n, mark)
}

// checkOrder checks that m, read after prev on what, has a larger
// MessageID and a larger TimeTick.
func (c *checker) checkOrder(what string, prev, m *messages.ImmutableMessage) {
	if m.ID() <= prev.ID() {
		c.violation("%s: MessageID %d (%s) read after %d (%s)", what, m.ID(), m.Type(), prev.ID(), prev.Type())
	}
	if m.TimeTick() <= prev.TimeTick() {
		c.violation("%s: %s", what, behind(m, prev))
	}
}

// behind says that m's TimeTick is not above top's.
func behind(m, top *messages.ImmutableMessage) string {
	return fmt.Sprintf("TimeTick %d of %s %d (term %d) not above %d of %s %d (term %d), %s earlier", m.TimeTick(),
		m.Type(), m.ID(), m.Term(), top.TimeTick(), top.Type(), top.ID(), top.Term(),
		top.TimeTick().Physical().Sub(m.TimeTick().Physical()))
}

// insert checks a plain insert read on v.
func (c *checker) insert(v streamwal.VChannel, m *messages.ImmutableMessage) {
	p := string(m.Payload())
	if k, ok := c.snap.bodies[p]; ok {
		c.violation("%s: body %q of transaction %d read at %d outside its transaction", v, p, k.id, m.ID())
		return
	}
	r, ok := c.snap.plain[p]
	if !ok {
		c.violation("%s: insert %q at %d was never appended", v, p, m.ID())
		return
	}
	c.plainSeen[p]++
	if r.v != v {
		c.violation("%s: insert %q read at %d, appended to %s", v, p, m.ID(), r.v)
	}
	switch r.outcome {
	case Refused:
		c.violation("%s: insert %q read at %d, its append was refused (%v)", v, p, m.ID(), r.err)
	case Acknowledged:
		if m.ID() != r.res.ID || m.TimeTick() != r.res.TimeTick {
			c.violation("%s: insert %q read at MessageID %d TimeTick %d, acknowledged at %d, %d", v, p,
				m.ID(), m.TimeTick(), r.res.ID, r.res.TimeTick)
		}
	}
}

// txn checks a transaction read on v.
func (c *checker) txn(v streamwal.VChannel, m *messages.ImmutableMessage) {
	k := txnKey{v: v, id: m.Txn().ID}
	c.txnSeen[k]++
	var bodies []string
	for _, b := range m.TxnBody() {
		bodies = append(bodies, string(b.Payload()))
	}
	r, ok := c.snap.txns[k]
	if !ok {
		c.violation("%s: transaction %d (bodies %q) at %d was never run", v, k.id, bodies, m.ID())
		return
	}
	switch r.outcome {
	case RolledBack, Aborted:
		c.violation("%s: transaction %d, %s (%v), read at %d", v, k.id, r.outcome, r.err, m.ID())
		return
	case Committed:
		if m.ID() != r.commit.ID || m.TimeTick() != r.commit.TimeTick {
			c.violation("%s: transaction %d read at MessageID %d TimeTick %d, committed at %d, %d", v, k.id,
				m.ID(), m.TimeTick(), r.commit.ID, r.commit.TimeTick)
		}
	}
	if !slices.Equal(bodies, r.bodies) {
		c.violation("%s: transaction %d read with bodies %q, appended %q", v, k.id, bodies, r.bodies)
	}
}

// readStream reads p's stream raw from its start through its last
// message as it is now, checking the order and the terms.
func (c *checker) readStream(ctx context.Context, be *jetstream.JetStream, p streamwal.PChannel) error {
	st, err := be.State(ctx, p)
	if err != nil {
		return fmt.Errorf("workload: state of %s: %w", p, err)
	}
	if st.Last == 0 {
		return nil
	}
	sc, err := be.Read(ctx, p, jetstream.ReadOptions{Start: jetstream.Earliest()})
	if err != nil {
		return fmt.Errorf("workload: read the stream of %s: %w", p, err)
	}
	defer func() { _ = sc.Close() }()
	var prev, top, barrier *messages.ImmutableMessage
	for m, err := range sc.All(ctx) {
		if err != nil {
			return fmt.Errorf("workload: read the stream of %s through %d: %w", p, st.Last, err)
		}
		c.report.StreamMessages++
		if prev != nil && m.ID() <= prev.ID() {
			c.violation("%s stream: MessageID %d (%s) read after %d (%s)", p, m.ID(), m.Type(), prev.ID(), prev.Type())
		}
		prev = m
		top = c.checkTimeTick(p, top, m)
		barrier = c.checkTerm(p, barrier, m)
		if m.ID() >= st.Last {
			return nil
		}
	}
	return fmt.Errorf("workload: read of the stream of %s ended before %d", p, st.Last)
}

// checkTimeTick checks that m, read in p's stream after top (the message
// with the largest TimeTick so far; nil before the first), has a larger
// TimeTick, and returns the new top.
func (c *checker) checkTimeTick(p streamwal.PChannel, top, m *messages.ImmutableMessage) *messages.ImmutableMessage {
	switch {
	case top == nil:
		return m
	case m.TimeTick() > top.TimeTick():
		return m
	case m.Type() == messages.TypeRecoveryBarrier && c.tolerateBarrier:
		c.report.BarriersBehind = append(c.report.BarriersBehind, fmt.Sprintf("%s stream: %s", p, behind(m, top)))
	default:
		c.violation("%s stream: %s", p, behind(m, top))
	}
	return top
}

// checkTerm checks the term of m, read in p's stream after the
// RecoveryBarrier barrier (nil before the first), and returns the newest
// barrier once m is read.
func (c *checker) checkTerm(p streamwal.PChannel, barrier, m *messages.ImmutableMessage) *messages.ImmutableMessage {
	if m.Type() == messages.TypeRecoveryBarrier {
		c.report.Barriers++
		if barrier != nil && m.Term() <= barrier.Term() {
			c.violation("%s stream: RecoveryBarrier of term %d at %d after the barrier of term %d at %d",
				p, m.Term(), m.ID(), barrier.Term(), barrier.ID())
		}
		return m
	}
	switch {
	case barrier == nil:
		c.violation("%s stream: %s %d of term %d before any RecoveryBarrier", p, m.Type(), m.ID(), m.Term())
	case m.Term() < barrier.Term():
		c.violation("%s stream: %s %d of term %d landed after the RecoveryBarrier of term %d at %d",
			p, m.Type(), m.ID(), m.Term(), barrier.Term(), barrier.ID())
	case m.Term() > barrier.Term():
		c.violation("%s stream: %s %d of term %d landed before its term's RecoveryBarrier (newest: term %d at %d)",
			p, m.Type(), m.ID(), m.Term(), barrier.Term(), barrier.ID())
	}
	return barrier
}

// tally counts the outcomes and checks that what must have been read
// was, as often as it may be.
func (c *checker) tally() {
	for p, r := range c.snap.plain {
		n := c.plainSeen[p]
		switch r.outcome {
		case Acknowledged:
			c.report.Plain.Acknowledged++
			if n != 1 {
				c.violation("%s: acknowledged insert %q (at %d) read %d times", r.v, p, r.res.ID, n)
			}
		case Unknown:
			c.report.Plain.Unknown++
			if n > 0 {
				c.report.Plain.UnknownLanded++
			}
			if n > 1 {
				c.violation("%s: insert %q of unknown outcome read %d times", r.v, p, n)
			}
		case Refused:
			c.report.Plain.Refused++
		}
	}
	for k, r := range c.snap.txns {
		n := c.txnSeen[k]
		switch r.outcome {
		case Committed:
			c.report.Txns.Committed++
			if n != 1 {
				c.violation("%s: committed transaction %d (at %d) read %d times", k.v, k.id, r.commit.ID, n)
			}
		case CommitUnknown:
			c.report.Txns.CommitUnknown++
			if n > 0 {
				c.report.Txns.CommitUnknownLanded++
			}
			if n > 1 {
				c.violation("%s: transaction %d of unknown commit read %d times", k.v, k.id, n)
			}
		case RolledBack:
			c.report.Txns.RolledBack++
		case Aborted:
			c.report.Txns.Aborted++
		}
	}
	slices.Sort(c.report.Violations)
}
