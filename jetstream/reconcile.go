package jetstream

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go"
	njs "github.com/nats-io/nats.go/jetstream"
	"github.com/synadia-io/orbit.go/jetstreamext"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/jetstream/pipeline"
	"github.com/streamwal/streamwal/messages"
)

// tailChunk is how many messages one direct batch get reads.
const tailChunk = 1000

// scan reads the stream's tail for a recovery of the pipeline: its last
// sequence, then every message after what the pipeline had acknowledged,
// which the pipeline judges; it settles the recovery with what it found
// or the error that stopped the read. A read that fails because the
// connection closed for good stops the writer.
func (s *sequencer) scan() {
	ctx, cancel := context.WithTimeout(context.Background(), s.w.b.opts.AckTimeout)
	defer cancel()
	var (
		sc  *pipeline.Scan[*AppendFuture]
		end uint64
	)
	last, err := s.lastSeq(ctx)
	if err == nil {
		sc, err = s.p.StartScan(last)
	}
	if err == nil {
		end, err = s.scanTail(ctx, sc.From(), last, sc.Judge)
	}
	if err != nil && !stopsWriter(err) && s.nc.IsClosed() {
		s.p.Halt(streamwal.Errorf(streamwal.CodeUnavailable, "connection closed while resolving the tail: %w", err))
		return
	}
	s.p.EndScan(time.Now(), sc, end, err)
	if err != nil && s.p.Fatal() == nil {
		s.w.log.Warn().Err(err).Msg("cannot read the tail yet; retrying")
	}
}

// stopsWriter reports whether an error stops a writer for good.
func stopsWriter(err error) bool {
	c := streamwal.CodeOf(err)
	return c == streamwal.CodeFenced || c == streamwal.CodeUnrecoverable
}

// scanTail calls judge for every message from from, up to last and beyond
// it until the stream ends: stream info is not isolated from an atomic
// batch's commit and may end inside one, direct gets are. It returns the
// sequence the tail really ends at.
func (s *sequencer) scanTail(ctx context.Context, from, last uint64, judge func(pipeline.TailMsg)) (uint64, error) {
	end := last
	for {
		it, err := jetstreamext.GetBatch(ctx, s.w.b.js, s.w.stream, tailChunk, jetstreamext.GetBatchSeq(from))
		if err != nil {
			if errors.Is(err, jetstreamext.ErrNoMessages) && from > last {
				return end, nil
			}
			return 0, classify(err)
		}
		got := 0
		for m, err := range it {
			if errors.Is(err, jetstreamext.ErrNoMessages) {
				break
			}
			if err != nil {
				return 0, classify(err)
			}
			judge(s.tailMsg(m))
			from = m.Sequence + 1
			end = max(end, m.Sequence)
			got++
		}
		if got == 0 {
			if from <= last {
				return 0, streamwal.Errorf(streamwal.CodeUnavailable, "tail of %s from %d is not readable yet", s.w.stream, from)
			}
			return end, nil
		}
	}
}

// tailMsg is what the pipeline needs of a stored message.
func (s *sequencer) tailMsg(m *njs.RawStreamMsg) pipeline.TailMsg {
	return pipeline.TailMsg{Seq: m.Sequence, ID: m.Header.Get(nats.MsgIdHdr), Term: m.Header.Get(messages.HdrTerm),
		Barrier: m.Subject == s.w.fenceSubj}
}
