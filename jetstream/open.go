package jetstream

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	njs "github.com/nats-io/nats.go/jetstream"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/messages"
)

// OpenWriter opens p for writing under term; see Backend.
func (b *JetStream) OpenWriter(ctx context.Context, p streamwal.PChannel, term uint64, opts ...WriterOption) (Writer, error) {
	if err := b.checkOpen(p); err != nil {
		return nil, err
	}
	if term == 0 {
		return nil, invalidArg("term must be positive")
	}
	var cfg writerConfig
	for _, o := range opts {
		o(&cfg)
	}
	barrier, err := b.barrierMessage(p, term, cfg)
	if err != nil {
		return nil, err
	}
	if err := b.Provision(ctx, p); err != nil {
		return nil, err
	}
	seq, err := b.landBarrier(ctx, p, term, barrier)
	if err != nil {
		return nil, err
	}
	return startWriter(b, p, term, barrier.Freeze(messages.MessageID(seq)))
}

// barrierMessage returns the barrier to append: the caller's, checked, or
// a default one.
func (b *JetStream) barrierMessage(p streamwal.PChannel, term uint64, cfg writerConfig) (*messages.MutableMessage, error) {
	m := cfg.barrier
	if m == nil {
		var err error
		m, err = b.codec.NewPChannelBody(messages.TypeRecoveryBarrier, p, messages.RecoveryBarrierBody{Term: term, Node: cfg.node})
		if err != nil {
			return nil, err
		}
	} else {
		m = m.Clone()
	}
	var body messages.RecoveryBarrierBody
	if m.Type() != messages.TypeRecoveryBarrier || m.PChannel() != p || m.Body(&body) != nil || body.Term != term {
		return nil, invalidArg("barrier must be a RecoveryBarrier of %s with term %d", p, term)
	}
	m.SetTerm(term)
	if m.MsgID() == "" {
		// Fixed per (pchannel, term, node): if the barrier landed but its
		// ack was lost, the same node reopening under the same term
		// recognizes it as its own.
		node := cfg.node
		if node == "" {
			node = "-"
		}
		if err := m.SetMsgID("barrier-" + p.String() + "-" + strconv.FormatUint(term, 10) + "-" + node); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// lastBarrier describes the newest barrier of a stream.
type lastBarrier struct {
	seq   uint64
	term  uint64
	msgID string
}

// landBarrier appends the barrier conditioned on the tail and on the newest
// barrier it saw, retrying while other writers move the tail, until it
// lands or a barrier of a term at or above ours is found.
func (b *JetStream) landBarrier(ctx context.Context, p streamwal.PChannel, term uint64, m *messages.MutableMessage) (uint64, error) {
	stream, err := b.js.Stream(ctx, b.codec.Cluster().StreamName(p))
	if err != nil {
		return 0, classify(fmt.Errorf("open %s: %w", p, err))
	}
	delay := 5 * time.Millisecond
	for attempt := 0; ; attempt++ {
		seq, retry, err := b.tryBarrier(ctx, stream, p, term, m, attempt < tailAttempts)
		if !retry || !streamwal.IsRetriable(err) && !wrongLastSequence(err) {
			return seq, err
		}
		b.log.Debug().Err(err).Str("pchannel", p.String()).Msg("barrier contended, retrying")
		select {
		case <-ctx.Done():
			return 0, fmt.Errorf("open %s under term %d: %w (last: %v)", p, term, ctx.Err(), err)
		case <-time.After(delay):
		}
		delay = min(2*delay, 500*time.Millisecond)
	}
}

// tailAttempts is how many times a barrier is conditioned on the stream's
// tail before it falls back to being conditioned on the newest barrier only.
// An earlier owner that is still writing moves the tail faster than a
// request-reply round trip, and would otherwise starve its successor; the
// barrier condition alone is what orders terms, and the earlier owner's
// next batch fails on it either way.
const tailAttempts = 3

// tryBarrier makes one attempt; retry reports whether another may succeed.
func (b *JetStream) tryBarrier(ctx context.Context, stream njs.Stream, p streamwal.PChannel, term uint64, m *messages.MutableMessage, onTail bool) (uint64, bool, error) {
	info, err := stream.Info(ctx)
	if err != nil {
		return 0, true, classify(err)
	}
	last, err := b.newestBarrier(ctx, stream, p)
	if err != nil {
		return 0, true, err
	}
	switch {
	case last.term == term && last.msgID == m.MsgID() && last.seq == info.State.LastSeq:
		return last.seq, false, nil // our own barrier; its ack was lost
	case last.term >= term:
		return 0, false, streamwal.Errorf(streamwal.CodeFenced,
			"%s already has a barrier of term %d at %d; cannot open under term %d", p, last.term, last.seq, term)
	}
	msg, err := b.codec.Encode(m)
	if err != nil {
		return 0, false, err
	}
	if onTail {
		msg.Header.Set(njs.ExpectedLastSeqHeader, strconv.FormatUint(info.State.LastSeq, 10))
	}
	msg.Header.Set(njs.ExpectedLastSubjSeqHeader, strconv.FormatUint(last.seq, 10))
	ack, err := b.js.PublishMsg(ctx, msg)
	if err != nil {
		return 0, true, classify(err)
	}
	return ack.Sequence, false, nil
}

// wrongLastSequence reports whether a publish failed its expected sequence
// (the tail moved), which a new attempt on the new tail may pass.
func wrongLastSequence(err error) bool {
	var apiErr *njs.APIError
	return errors.As(err, &apiErr) && (apiErr.ErrorCode == njs.JSErrCodeStreamWrongLastSequence ||
		apiErr.ErrorCode == njs.JSErrCodeStreamWrongLastSequenceConstant)
}

// newestBarrier reads the newest RecoveryBarrier of p (zero if none).
func (b *JetStream) newestBarrier(ctx context.Context, stream njs.Stream, p streamwal.PChannel) (lastBarrier, error) {
	raw, err := stream.GetLastMsgForSubject(ctx, b.barrierSubject(p))
	if errors.Is(err, njs.ErrMsgNotFound) {
		return lastBarrier{}, nil
	}
	if err != nil {
		return lastBarrier{}, classify(err)
	}
	term, err := strconv.ParseUint(raw.Header.Get(messages.HdrTerm), 10, 64)
	if err != nil {
		return lastBarrier{}, streamwal.Errorf(streamwal.CodeUnrecoverable, "barrier %d of %s has no term: %v", raw.Sequence, p, err)
	}
	return lastBarrier{seq: raw.Sequence, term: term, msgID: raw.Header.Get(nats.MsgIdHdr)}, nil
}
