package pipeline

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/streamwal/streamwal"
)

// TestSimulation runs a pipeline against a model of a JetStream stream
// (expected last sequence, expected last message ID, the barrier
// subject's last sequence, deduplication by message ID, atomic batches)
// over a network that delays, reorders nothing, and loses answers, with
// refusals, reconnections, a newer owner's barrier and closes at random
// points. After every step the invariants hold; at the end:
//
//   - every append has exactly one result;
//   - an append resolved is stored at the sequences it was given, under
//     its message IDs, once each;
//   - nothing of an append that failed with a definite error (fenced,
//     closed, refused) is stored;
//   - nothing of this writer is stored after a newer owner's barrier;
//   - appends of the writer's own message IDs are stored in the order
//     they were queued.
func TestSimulation(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		sim := newSim(t)
		for range rapid.IntRange(1, 200).Draw(t, "steps") {
			sim.step()
			sim.check()
		}
		sim.finish()
		sim.verify()
	})
}

// simMsg is one message of the model stream.
type simMsg struct {
	id      string
	term    string
	barrier bool
}

// simStream is the model of the stream: messages by sequence (index+1).
type simStream struct {
	msgs    []simMsg
	ids     map[string]uint64
	barrier uint64 // the newest barrier's sequence
}

// last is the stream's last sequence and message ID.
func (s *simStream) last() (uint64, string) {
	n := uint64(len(s.msgs))
	return n, s.msgs[n-1].id
}

// store appends messages and returns the last sequence.
func (s *simStream) store(msgs ...simMsg) uint64 {
	for _, m := range msgs {
		s.msgs = append(s.msgs, m)
		seq := uint64(len(s.msgs))
		if m.id != "" {
			s.ids[m.id] = seq
		}
		if m.barrier {
			s.barrier = seq
		}
	}
	return uint64(len(s.msgs))
}

// publish applies a unit as the server does and returns its answer.
func (s *simStream) publish(u *Unit[string], busy bool) Ack {
	var msgs []simMsg
	for _, r := range u.Reqs {
		for _, id := range r.ids {
			msgs = append(msgs, simMsg{id: id, term: "1"})
		}
	}
	wrong := func() Ack {
		return Ack{Num: u.Num, WrongSeq: true, Err: streamwal.Errorf(streamwal.CodeUnavailable, "wrong last sequence")}
	}
	if !u.Atomic() {
		if seq, ok := s.ids[msgs[0].id]; ok {
			return Ack{Num: u.Num, Seq: seq, Count: 1, Duplicate: true}
		}
	} else {
		// A batch holding a stored message ID, or one twice, is refused.
		seen := map[string]bool{}
		for _, m := range msgs {
			if _, ok := s.ids[m.id]; ok || seen[m.id] {
				return Ack{Num: u.Num, RefusedDup: true, Err: streamwal.Errorf(streamwal.CodeUnavailable, "duplicate in batch")}
			}
			seen[m.id] = true
		}
	}
	last, lastID := s.last()
	switch {
	case busy:
		return Ack{Num: u.Num, Err: streamwal.Errorf(streamwal.CodeUnavailable, "busy")}
	case u.Expect != last:
		return wrong()
	case !u.Atomic() && u.After != lastID:
		return Ack{Num: u.Num, Err: streamwal.Errorf(streamwal.CodeUnavailable, "wrong last msg id")}
	case u.Fenced && u.Fence != s.barrier:
		return wrong()
	}
	return Ack{Num: u.Num, Seq: s.store(msgs...), Count: uint64(u.N)}
}

// sim is one simulated writer.
type sim struct {
	t        *rapid.T
	p        *Pipeline[string]
	now      time.Time
	stream   *simStream
	network  []*Unit[string] // sent, not yet at the server
	replies  []Ack           // answered, not yet at the writer
	reqs     map[string]*Request[string]
	order    []string // requests in the order they were queued
	results  map[string][]Result[string]
	fencedAt uint64          // the newer owner's barrier, once there is one
	callers  []string        // requests with the caller's message IDs
	retries  map[string]bool // requests that repeat another's message IDs
	closed   bool
	stopped  bool
	next     int
}

// newSim starts a writer whose barrier is the stream's first message.
func newSim(t *rapid.T) *sim {
	s := &sim{t: t, now: t0, stream: &simStream{ids: map[string]uint64{}},
		reqs: map[string]*Request[string]{}, results: map[string][]Result[string]{}, retries: map[string]bool{}}
	s.stream.store(simMsg{id: "barrier", term: "1", barrier: true})
	s.p = New[string](Config{
		PChannel: "pchan-0", Term: 1, IDPrefix: "w-", Barrier: 1, BarrierID: "barrier",
		Replicas:        rapid.SampledFrom([]int{1, 3}).Draw(t, "replicas"),
		GroupCommit:     rapid.Bool().Draw(t, "group-commit"),
		PlainUpTo:       rapid.IntRange(0, 4).Draw(t, "plain-up-to"),
		MaxBatch:        rapid.IntRange(1, 6).Draw(t, "max-batch"),
		MaxInFlight:     rapid.IntRange(1, 4).Draw(t, "max-in-flight"),
		MaxInFlightMsgs: rapid.IntRange(6, 16).Draw(t, "max-in-flight-msgs"),
		AckTimeout:      5 * time.Second, CloseBudget: 3 * time.Second,
	})
	return s
}

// step draws one event and applies it.
func (s *sim) step() {
	if s.stopped {
		return
	}
	switch rapid.IntRange(0, 11).Draw(s.t, "event") {
	case 0, 1:
		s.enqueue()
	case 2, 3:
		s.send()
	case 4, 5:
		s.serve(rapid.IntRange(0, 9).Draw(s.t, "busy") == 0)
	case 6, 7:
		s.answer(rapid.IntRange(0, 9).Draw(s.t, "lose") == 0)
	case 8:
		s.now = s.now.Add(time.Duration(rapid.IntRange(0, 6000).Draw(s.t, "ms")) * time.Millisecond)
		s.p.Tick(s.now)
	case 9:
		if rapid.IntRange(0, 3).Draw(s.t, "reconnect") == 0 {
			s.replies = nil // answers lost with the old connection
			s.p.Reconnected(s.now)
		}
	case 10:
		s.other()
	case 11:
		s.scan()
	}
	s.collect()
}

// other is a rare event: a newer owner's barrier, or a close.
func (s *sim) other() {
	switch rapid.IntRange(0, 9).Draw(s.t, "other") {
	case 0:
		if s.fencedAt == 0 {
			s.fencedAt = s.stream.store(simMsg{id: "barrier-2", term: "2", barrier: true})
		}
	case 1:
		if !s.closed {
			s.closed = true
			s.p.Close(s.now)
		}
	}
}

// enqueue queues an append of the writer's IDs or, rarely, the caller's.
func (s *sim) enqueue() {
	n := rapid.IntRange(1, 3).Draw(s.t, "msgs")
	name := fmt.Sprintf("r%d", s.next)
	s.next++
	prefix := "w-"
	if rapid.IntRange(0, 4).Draw(s.t, "caller") == 0 {
		prefix = "c-"
	}
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("%s%s.%d", prefix, name, i)
	}
	if prefix == "c-" && len(s.callers) > 0 && rapid.Bool().Draw(s.t, "retry") {
		// A caller retrying an earlier append, perhaps with more messages:
		// what is stored of it resolves at its first sequences.
		earlier := rapid.SampledFrom(s.callers).Draw(s.t, "retried")
		ids = append(append([]string(nil), s.reqs[earlier].ids...), ids[:rapid.IntRange(0, 1).Draw(s.t, "more")]...)
		s.retries[name] = true
	}
	if prefix == "c-" {
		s.callers = append(s.callers, name)
	}
	r := &Request[string]{}
	r.Init(name, ids)
	s.reqs[name] = r
	s.order = append(s.order, name)
	if s.closed {
		// A closing writer refuses new appends before they reach it.
		s.results[name] = append(s.results[name], Result[string]{Req: r, Err: streamwal.Errorf(streamwal.CodeClosed, "closed")})
		return
	}
	s.p.Enqueue(r)
}

// send puts every unit the pipeline forms on the network; rarely the
// client library refuses a message of a first send (it never leaves), or
// the connection fails while a unit goes out (it leaves or not).
func (s *sim) send() {
	for u := s.p.Next(s.now); u != nil; u = s.p.Next(s.now) {
		switch rapid.IntRange(0, 29).Draw(s.t, "publish") {
		case 0:
			if k := firstSend(u); k >= 0 {
				s.p.Refused(s.now, u, k, streamwal.Errorf(streamwal.CodeInvalidArgument, "refused by the client"))
				return
			}
		case 1:
			if rapid.Bool().Draw(s.t, "left") {
				s.network = append(s.network, u)
			}
			s.p.SendFailed(s.now, u, streamwal.Errorf(streamwal.CodeUnavailable, "connection lost"))
			return
		}
		s.network = append(s.network, u)
	}
}

// firstSend is the index of a request the unit sends for the first time,
// or -1.
func firstSend(u *Unit[string]) int {
	for k, r := range u.Reqs {
		if !r.Resend() {
			return k
		}
	}
	return -1
}

// serve lets the server take the next unit off the network.
func (s *sim) serve(busy bool) {
	if len(s.network) == 0 {
		return
	}
	u := s.network[0]
	s.network = s.network[1:]
	a := s.stream.publish(u, busy)
	if !u.Quiet { // a message without a reply subject is answered by nothing
		s.replies = append(s.replies, a)
	}
}

// answer delivers (or loses) the next answer.
func (s *sim) answer(lose bool) {
	if len(s.replies) == 0 {
		return
	}
	a := s.replies[0]
	s.replies = s.replies[1:]
	if !lose {
		s.p.Ack(s.now, a)
	}
}

// scan reads the model stream when the pipeline asks.
func (s *sim) scan() {
	if !s.p.NeedScan() {
		return
	}
	last, _ := s.stream.last()
	sc, err := s.p.StartScan(last)
	if err != nil {
		s.p.EndScan(s.now, nil, 0, err)
		return
	}
	for seq := sc.From(); seq <= last; seq++ {
		m := s.stream.msgs[seq-1]
		sc.Judge(TailMsg{Seq: seq, ID: m.id, Term: m.term, Barrier: m.barrier})
	}
	s.p.EndScan(s.now, sc, last, nil)
}

// collect records the results.
func (s *sim) collect() {
	for _, r := range s.p.Ready().Results {
		name := r.Req.Payload()
		s.results[name] = append(s.results[name], r)
	}
}

// check asserts the invariants.
func (s *sim) check() {
	if err := s.p.CheckInvariants(); err != nil {
		s.t.Fatalf("invariants: %v", err)
	}
}

// finish closes the writer and runs it until it is done, then stops it.
func (s *sim) finish() {
	if !s.closed && !s.stopped {
		s.closed = true
		s.p.Close(s.now)
	}
	for i := 0; i < 10000 && !s.stopped && !s.p.Done(s.now); i++ {
		s.send()
		s.serve(false)
		s.answer(false)
		s.scan()
		if len(s.network) == 0 && len(s.replies) == 0 {
			s.now = s.now.Add(time.Second)
			s.p.Tick(s.now)
		}
		s.collect()
		s.check()
	}
	if !s.p.Done(s.now) && s.p.Fatal() == nil {
		s.t.Fatalf("the writer never finished: %s", s.describe())
	}
	s.p.Stop(streamwal.Errorf(streamwal.CodeClosed, "closed"))
	s.collect()
	s.check()
	// What is still on the network may land: the results say so.
	for _, u := range s.network {
		s.stream.publish(u, false)
	}
}

// describe is the pipeline's state, for failures.
func (s *sim) describe() string {
	return fmt.Sprintf("phase %d, %d queued, %d in flight, %d on the network, %d replies",
		s.p.phase, len(s.p.queue), len(s.p.inflight), len(s.network), len(s.replies))
}

// verify checks the results against the stream.
func (s *sim) verify() {
	var lastSeq uint64
	for _, name := range s.order {
		rs := s.results[name]
		if len(rs) != 1 {
			s.t.Fatalf("%s has %d results", name, len(rs))
		}
		r, req := rs[0], s.reqs[name]
		stored := s.storedAt(req)
		switch {
		case r.Err == nil:
			s.verifyResolved(name, req, r, stored)
			if strings.HasPrefix(req.ids[0], "w-") {
				if stored[0] < lastSeq {
					s.t.Fatalf("%s stored at %d, before an append queued earlier (%d)", name, stored[0], lastSeq)
				}
				lastSeq = stored[len(stored)-1]
			}
		case streamwal.CodeOf(r.Err) == streamwal.CodeUnknownOutcome || s.retries[name]:
		default:
			for i, seq := range stored {
				if seq != 0 && strings.HasPrefix(req.ids[i], "w-") {
					s.t.Fatalf("%s failed with %v but its message %d is stored at %d", name, r.Err, i, seq)
				}
			}
		}
	}
	if s.fencedAt > 0 {
		for seq := s.fencedAt + 1; seq <= uint64(len(s.stream.msgs)); seq++ {
			if s.stream.msgs[seq-1].term == "1" {
				s.t.Fatalf("message %d (%s) of the fenced writer lands after the barrier at %d", seq, s.stream.msgs[seq-1].id, s.fencedAt)
			}
		}
	}
}

// storedAt is where each message of a request is stored (0: nowhere).
func (s *sim) storedAt(r *Request[string]) []uint64 {
	seqs := make([]uint64, len(r.ids))
	for i, id := range r.ids {
		seqs[i] = s.stream.ids[id]
	}
	return seqs
}

// verifyResolved checks that a resolved request is stored where it was told.
func (s *sim) verifyResolved(name string, req *Request[string], r Result[string], stored []uint64) {
	for i := range req.ids {
		want := r.First + uint64(i)
		if r.Seqs != nil {
			want = r.Seqs[i]
		}
		if stored[i] == 0 || stored[i] != want {
			s.t.Fatalf("%s message %d resolved at %d, stored at %d", name, i, want, stored[i])
		}
	}
}
