package conformance

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/jetstream"
	"github.com/streamwal/streamwal/messages"
)

// Sizes of the fencing test.
const (
	// fenceAppenders is how many goroutines append to the writer that is
	// about to be fenced.
	fenceAppenders = 4
	// fenceMaxLead bounds how many messages the old writer gets
	// acknowledged before its successor opens.
	fenceMaxLead = 300
	// fenceRoundBudget bounds the waits of one round.
	fenceRoundBudget = 30 * time.Second
)

// SeedEnv fixes the random seed of the fencing and fault tests (it is
// logged on every run).
const SeedEnv = "STREAMWAL_SEED"

// seed returns the random seed of a test and logs it.
func seed(t *testing.T) uint64 {
	s := uint64(time.Now().UnixNano())
	if v, err := strconv.ParseUint(os.Getenv(SeedEnv), 10, 64); err == nil {
		s = v
	}
	t.Logf("seed %d (set %s to repeat)", s, SeedEnv)
	return s
}

// attempt is the outcome of one Append.
type attempt struct {
	// names are the payloads of the append's messages, unique in the
	// test, and their message IDs, unless the append left them to the
	// writer (writerIDs).
	names []string
	ids   []messages.MessageID
	err   error
}

// fenceStats counts what the fencing test saw.
type fenceStats struct {
	rounds, violations       int
	aAcked, aFenced          int // appends of the old writers
	aUnknown, aUnknownLanded int
	bAcked                   int // appends of the new writers
	elapsed                  time.Duration
}

// fencer runs the fencing rounds.
type fencer struct {
	e        *env
	t        *testing.T
	seed     uint64
	p        streamwal.PChannel
	v        streamwal.VChannel
	stats    fenceStats
	reported int
	// prev are the appends of the writer now being fenced, made in the
	// round that opened it.
	prev []attempt
}

// violation records a broken invariant.
func (f *fencer) violation(round int, format string, args ...any) {
	f.stats.violations++
	f.reported++
	if f.reported <= maxReported {
		f.t.Errorf("round %d: "+format, append([]any{round}, args...)...)
	}
}

// testFencing: rounds of a writer under concurrent load fenced by a writer
// of the next term opened on another connection.
func (e *env) testFencing(t *testing.T) {
	iters := e.h.FenceIterations
	ctx, cancel := context.WithTimeout(t.Context(), testBudget+time.Duration(iters)*5*time.Second)
	defer cancel()
	f := &fencer{e: e, t: t, seed: seed(t), p: e.pchannel(t, "fence")}
	f.v = vchannel(t, f.p, 1)
	bs := [2]jetstream.Backend{e.backend(t), e.backend(t)}
	start := time.Now()
	a := openWriter(ctx, t, bs[0], f.p, 1)
	for r := range iters {
		next, ok := f.round(ctx, r, a, bs[r%2], bs[(r+1)%2])
		if !ok {
			break
		}
		a = next
		f.stats.rounds++
	}
	// A last writer fences the last one, so that anything a fenced writer
	// might still land shows up before its barrier in the final read.
	_ = a.Close()
	final := openWriter(ctx, t, bs[0], f.p, a.Term()+1)
	all := mustReadRange(ctx, t, bs[1], f.p, jetstream.ReadOptions{Start: jetstream.Earliest()}, final.Barrier().ID())
	if err := strictlyIncreasing(all); err != nil {
		f.violation(-1, "final read: %v", err)
	}
	f.stats.violations += checkTerms(t, "final read", all)
	seen := map[string]messages.MessageID{}
	for _, m := range all {
		if prev, ok := seen[m.MsgID()]; ok {
			f.violation(-1, "message ID %q stored at %d and %d", m.MsgID(), prev, m.ID())
		}
		seen[m.MsgID()] = m.ID()
	}
	f.stats.elapsed = time.Since(start)
	s := f.stats
	t.Logf("fencing: %d of %d rounds in %v, %d violations; old writers: %d appends acknowledged, %d refused as fenced, %d unknown outcome (%d of them landed); new writers: %d appends; stream of %d messages",
		s.rounds, iters, s.elapsed.Round(time.Millisecond), s.violations, s.aAcked, s.aFenced, s.aUnknown, s.aUnknownLanded, s.bAcked, len(all))
	if s.rounds < iters {
		t.Errorf("fencing: only %d of %d rounds ran", s.rounds, iters)
	}
}

// round fences a (term t, on backend ba) by a writer of term t+1 opened on
// bb while a's appenders run, and returns the new writer.
func (f *fencer) round(ctx context.Context, r int, a jetstream.Writer, ba, bb jetstream.Backend) (jetstream.Writer, bool) {
	t := f.t
	term := a.Term()
	rng := rand.New(rand.NewPCG(f.seed, uint64(r)))
	roundCtx, cancelRound := context.WithCancel(ctx)
	defer cancelRound()

	var (
		mu       sync.Mutex
		attempts []attempt
		acked    atomic.Int64
		stop     atomic.Bool
		wg       sync.WaitGroup
	)
	for g := range fenceAppenders {
		grng := rand.New(rand.NewPCG(f.seed^uint64(g+1), uint64(r)))
		wg.Go(func() {
			for i := 0; !stop.Load(); i++ {
				n := 1 + grng.IntN(4)
				if grng.IntN(10) == 0 {
					n = 5 + grng.IntN(40)
				}
				at := attempt{names: make([]string, n)}
				msgs := make([]*messages.MutableMessage, n)
				// Half the single messages leave their ID to the writer,
				// which then chains them by ID instead of fencing them
				// by the barrier (see the sequencer's fenced).
				writerIDs := n == 1 && grng.IntN(2) == 0
				for k := range n {
					at.names[k] = fmt.Sprintf("f%d-t%d-g%d-%d-%d", r, term, g, i, k)
					msgID := at.names[k]
					if writerIDs {
						msgID = ""
					}
					m, err := f.e.newInsert(f.v, at.names[k], msgID)
					if err != nil {
						t.Errorf("build: %v", err)
						return
					}
					msgs[k] = m
				}
				at.ids, at.err = a.Append(roundCtx, msgs...)
				mu.Lock()
				attempts = append(attempts, at)
				mu.Unlock()
				switch {
				case at.err == nil:
					acked.Add(int64(n))
				case errors.Is(at.err, streamwal.ErrUnknownOutcome):
				default: // fenced, or anything else (judged below)
					return
				}
				if grng.IntN(3) == 0 {
					runtime.Gosched()
				}
			}
		})
	}
	abort := func() {
		stop.Store(true)
		cancelRound()
		wg.Wait()
	}

	lead := int64(rng.IntN(fenceMaxLead))
	if !waitFor(roundCtx, fenceRoundBudget, func() bool { return acked.Load() >= lead }) {
		f.violation(r, "the writer of term %d got only %d of %d messages acknowledged in %v", term, acked.Load(), lead, fenceRoundBudget)
		abort()
		return nil, false
	}
	bw, err := bb.OpenWriter(ctx, f.p, term+1)
	if err != nil {
		f.violation(r, "open under term %d while term %d appends: %v", term+1, term, err)
		abort()
		return nil, false
	}
	t.Cleanup(func() { _ = bw.Close() })
	checkBarrier(t, bw, f.p, term+1)
	var bAtt []attempt
	for i := range 1 + rng.IntN(3) {
		n := 1 + rng.IntN(3)
		at := attempt{}
		msgs := make([]*messages.MutableMessage, n)
		for k := range n {
			id := fmt.Sprintf("f%d-t%d-B-%d-%d", r, term+1, i, k)
			msgs[k], at.names = f.e.insert(t, f.v, id, id), append(at.names, id)
		}
		at.ids, at.err = bw.Append(ctx, msgs...)
		if at.err == nil {
			at.err = contiguous(at.ids, n)
		}
		if at.err != nil {
			f.violation(r, "append of the term %d writer: %v", term+1, at.err)
			abort()
			return nil, false
		}
		bAtt = append(bAtt, at)
	}

	// The old writer's appenders stop when it tells them it is fenced.
	if !waitDone(&wg, fenceRoundBudget) {
		f.violation(r, "the writer of term %d still appends %v after term %d opened", term, fenceRoundBudget, term+1)
		abort()
	}
	stop.Store(true)
	wg.Wait()
	if !closedWithin(a.Done(), promptly) {
		f.violation(r, "the fenced writer of term %d did not stop", term)
	} else if !errors.Is(a.Err(), streamwal.ErrFenced) {
		f.violation(r, "the fenced writer of term %d says %v, want ErrFenced", term, a.Err())
	}
	_ = a.Close()

	last := bw.Barrier().ID()
	for _, at := range bAtt {
		last = max(last, at.ids[len(at.ids)-1])
	}
	msgs, err := readRange(ctx, bb, f.p, jetstream.ReadOptions{Start: jetstream.From(a.Barrier().ID())}, last)
	if err != nil {
		f.violation(r, "%v", err)
		return bw, false
	}
	f.check(r, a, bw, attempts, bAtt, msgs)
	f.prev = bAtt

	// Terms at or below the newest barrier are refused.
	for _, tm := range []uint64{term, term + 1} {
		w, err := ba.OpenWriter(ctx, f.p, tm)
		if err == nil {
			_ = w.Close()
		}
		if !errors.Is(err, streamwal.ErrFenced) {
			f.violation(r, "open under term %d after term %d opened: %v, want ErrFenced", tm, term+1, err)
		}
	}
	return bw, true
}

// check judges one round's stream, from a's barrier to the last append of
// b, against what each writer was told.
func (f *fencer) check(r int, a, b jetstream.Writer, aAtt, bAtt []attempt, msgs []*messages.ImmutableMessage) {
	term := a.Term()
	byID := map[messages.MessageID]*messages.ImmutableMessage{}
	byName := map[string][]messages.MessageID{}
	for i, m := range msgs {
		if i > 0 && m.ID() <= msgs[i-1].ID() {
			f.violation(r, "MessageID %d delivered after %d", m.ID(), msgs[i-1].ID())
		}
		byID[m.ID()] = m
		byName[name(m)] = append(byName[name(m)], m.ID())
	}
	if len(msgs) == 0 || msgs[0].ID() != a.Barrier().ID() {
		f.violation(r, "the read from the barrier of term %d (%d) starts at %d", term, a.Barrier().ID(), lastID(msgs[:min(1, len(msgs))]))
	}
	barriers := 0
	newBarrier := b.Barrier().ID()
	for _, m := range msgs {
		switch {
		case m.Type() == messages.TypeRecoveryBarrier:
			barriers++
			switch m.ID() {
			case a.Barrier().ID():
				if err := barrierProblem(m, term); err != nil {
					f.violation(r, "%v", err)
				}
			case newBarrier:
				if err := barrierProblem(m, term+1); err != nil {
					f.violation(r, "%v", err)
				}
			default:
				f.violation(r, "unexpected barrier %d of term %d", m.ID(), m.Term())
			}
		case m.ID() > newBarrier && m.Term() != term+1:
			f.violation(r, "message %d (%s) of term %d landed after the barrier of term %d at %d", m.ID(), m.MsgID(), m.Term(), term+1, newBarrier)
		case m.ID() < newBarrier && m.Term() != term:
			f.violation(r, "message %d (%s) of term %d before the barrier of term %d", m.ID(), m.MsgID(), m.Term(), term+1)
		}
		if ids := byName[name(m)]; len(ids) > 1 && ids[0] == m.ID() && m.Type() != messages.TypeRecoveryBarrier {
			f.violation(r, "message %q stored %d times: %v", name(m), len(ids), ids)
		}
	}
	if barriers != 2 {
		f.violation(r, "%d barriers between term %d's and the end, want 2", barriers, term)
	}
	if m := byID[newBarrier]; m == nil || m.Type() != messages.TypeRecoveryBarrier {
		f.violation(r, "the barrier of term %d is not at %d", term+1, newBarrier)
	}

	known := map[string]bool{}
	acked := func(who string, at attempt) {
		for k, id := range at.ids {
			m := byID[id]
			switch {
			case m == nil:
				f.violation(r, "%s append acknowledged at %d is not in the stream", who, id)
			case name(m) != at.names[k]:
				f.violation(r, "%s append of %q acknowledged at %d, which holds %q", who, at.names[k], id, name(m))
			}
		}
	}
	for _, at := range f.prev {
		acked("term "+strconv.FormatUint(term, 10)+" (as the new writer)", at)
		for _, id := range at.names {
			known[id] = true
		}
	}
	for _, at := range bAtt {
		f.stats.bAcked++
		acked("term "+strconv.FormatUint(term+1, 10), at)
		for _, id := range at.names {
			known[id] = true
		}
	}
	for _, at := range aAtt {
		for _, id := range at.names {
			known[id] = true
		}
		landed := 0
		for _, id := range at.names {
			landed += len(byName[id])
		}
		// By the first code in the chain: an unknown outcome may wrap the
		// fencing that stopped the writer, and still may have landed.
		switch streamwal.CodeOf(at.err) {
		case "":
			f.stats.aAcked++
			acked("term "+strconv.FormatUint(term, 10), at)
		case streamwal.CodeFenced:
			f.stats.aFenced++
			if landed > 0 {
				f.violation(r, "an append refused with %q landed: %q at %v", at.err, at.names[0], byName[at.names[0]])
			}
		case streamwal.CodeUnknownOutcome:
			f.stats.aUnknown++
			if landed > 0 {
				f.stats.aUnknownLanded++
			}
			if landed != 0 && landed != len(at.names) {
				f.violation(r, "only %d of the %d messages of an append landed (%q...)", landed, len(at.names), at.names[0])
			}
		default:
			f.violation(r, "append of the term %d writer failed with %q (code %s), want success, ErrFenced or ErrUnknownOutcome",
				term, at.err, streamwal.CodeOf(at.err))
		}
	}
	for _, m := range msgs {
		if m.Type() != messages.TypeRecoveryBarrier && !known[name(m)] {
			f.violation(r, "message %d (%q) was never appended", m.ID(), name(m))
		}
	}
}

// name is what identifies a message of the test: its payload.
func name(m *messages.ImmutableMessage) string { return string(m.Payload()) }
