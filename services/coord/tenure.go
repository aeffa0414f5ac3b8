package coord

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/messages"
	"github.com/streamwal/streamwal/services/coord/broadcast"
	"github.com/streamwal/streamwal/services/wire"
)

// tenure is one epoch of an active coordinator (the revision that created
// its lease): the oracle, the request handlers and the control loop, all
// stopped together when it ends. It is never called a term: a term is a
// PChannel's ownership term (termTable, wire.Assignment.Term).
type tenure struct {
	c       *Coordinator
	epoch   uint64
	log     zerolog.Logger
	ctx     context.Context
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	deposed atomic.Bool
	subs    []*nats.Subscription

	tsoMu    sync.Mutex
	tso      *oracle
	tsoStore *store
	terms    *termTable // each PChannel's assigned term, for the oracle's fence

	ctl   *control
	bc    *broadcast.Broadcaster
	codec *messages.Codec
}

// tsoRecord is the persisted bound of the oracle.
type tsoRecord struct {
	Bound messages.TimeTick `json:"bound"`
	Epoch uint64            `json:"epoch"`
}

// startTenure takes over under epoch: it fences every key with a rewrite
// under the epoch, then starts the handlers and the control loop.
func startTenure(ctx context.Context, c *Coordinator, epoch uint64) (*tenure, error) {
	t := &tenure{c: c, epoch: epoch, log: c.log.With().Uint64("epoch", epoch).Logger(),
		tsoStore: newStore(c.buckets[streamwal.BucketTSO]), terms: newTermTable()}
	t.ctx, t.cancel = context.WithCancel(context.Background())
	if err := t.startOracle(ctx); err != nil {
		t.cancel()
		return nil, err
	}
	ctl, err := newControl(ctx, t)
	if err != nil {
		t.cancel()
		return nil, err
	}
	t.ctl = ctl
	if err := t.startBroadcaster(ctx); err != nil {
		t.cancel()
		return nil, err
	}
	if err := t.subscribe(); err != nil {
		t.close()
		return nil, err
	}
	t.wg.Add(2)
	go func() { defer t.wg.Done(); ctl.run() }()
	go func() { defer t.wg.Done(); ctl.watchNodes() }()
	return t, nil
}

// startOracle starts above the persisted bound and persists a new one.
func (t *tenure) startOracle(ctx context.Context) error {
	var rec tsoRecord
	if _, err := t.tsoStore.load(ctx, streamwal.KeyTSOBound, &rec); err != nil {
		return err
	}
	t.tso = newOracle(rec.Bound)
	_, last, bound, err := t.tso.reserve(time.Now(), 1)
	if err != nil {
		return err
	}
	if err := t.tsoStore.put(ctx, streamwal.KeyTSOBound, tsoRecord{Bound: bound, Epoch: t.epoch}); err != nil {
		return err
	}
	t.tso.commit(last, bound)
	return nil
}

// subscribe serves the coordinator's request subjects. Broadcasts and
// their acknowledgements are served concurrently (a broadcast may wait for
// the keys of another); the rest in arrival order.
func (t *tenure) subscribe() error {
	cl := t.c.cfg.Conn
	for _, h := range []struct {
		op    streamwal.CoordOp
		h     wire.Handler
		async bool
	}{
		{streamwal.CoordTSO, wire.Handle(t.handleTSO), false},
		{streamwal.CoordAllocate, wire.Handle(t.ctl.handleAllocate), false},
		{streamwal.CoordRelease, wire.Handle(t.ctl.handleRelease), false},
		{streamwal.CoordBalance, t.ctl.handleBalance, false},
		{streamwal.CoordStatus, t.ctl.handleStatus, false},
		{streamwal.CoordBroadcast, wire.Handle(t.handleBroadcast), true},
		{streamwal.CoordBroadcastAck, wire.Handle(t.handleBroadcastAck), true},
	} {
		sub, err := cl.Subscribe(t.c.cfg.Cluster.CoordSubject(h.op), t.serve(h.op, h.h, h.async))
		if err != nil {
			return streamwal.Errorf(streamwal.CodeUnavailable, "subscribe %s: %v", h.op, err)
		}
		t.subs = append(t.subs, sub)
	}
	// Active only once the server knows the subscriptions.
	if err := cl.Flush(); err != nil {
		return streamwal.Errorf(streamwal.CodeUnavailable, "flush subscriptions: %v", err)
	}
	return nil
}

// serve adapts a handler of op to a subscription, logging what it
// failed or refused; async handlers run in their own goroutines.
func (t *tenure) serve(op streamwal.CoordOp, h wire.Handler, async bool) nats.MsgHandler {
	answer := func(m *nats.Msg) {
		if !t.c.leaseHeld() || t.isDeposed() {
			// The lease may have passed to a successor: answer nothing
			// from this tenure's memory.
			_ = wire.Respond(m, nil, streamwal.Errorf(streamwal.CodeUnavailable, "coordinator %s is not surely active", t.c.cfg.ID))
			return
		}
		body, err := h(t.ctx, m.Data)
		if errors.Is(err, errDeposed) {
			t.depose()
		}
		t.logRequest(op, err)
		if rerr := wire.Respond(m, body, err); rerr != nil {
			t.log.Debug().Err(rerr).Msg("reply")
		}
	}
	if !async {
		return answer
	}
	return func(m *nats.Msg) {
		t.wg.Add(1)
		go func() {
			defer t.wg.Done()
			answer(m)
		}()
	}
}

// allocateTSO hands out TimeTicks, persisting the bound ahead of them. A
// request scoped to a PChannel under a term it is no longer assigned under
// is refused (streamwal.CodeFenced), checked under the lock that orders
// the reservations: the new owner draws its barrier's TimeTick only after
// its term was recorded, so every TimeTick its predecessor got (a batch
// included) is below the barrier's.
func (t *tenure) allocateTSO(ctx context.Context, req wire.TSORequest) (wire.TSOReply, error) {
	t.tsoMu.Lock()
	defer t.tsoMu.Unlock()
	if err := t.terms.admit(req); err != nil {
		return wire.TSOReply{}, err
	}
	first, last, bound, err := t.tso.reserve(time.Now(), req.Count)
	if err != nil {
		return wire.TSOReply{}, err
	}
	if bound != 0 {
		if err := t.tsoStore.put(ctx, streamwal.KeyTSOBound, tsoRecord{Bound: bound, Epoch: t.epoch}); err != nil {
			return wire.TSOReply{}, err
		}
	}
	t.tso.commit(last, bound)
	return wire.TSOReply{First: first}, nil
}

// depose marks the tenure as refused by the store; the campaign steps down
// at its next round.
func (t *tenure) depose() {
	if !t.deposed.Swap(true) {
		t.log.Warn().Msg("a write was refused: another coordinator is active")
	}
}

// isDeposed reports whether a write was refused.
func (t *tenure) isDeposed() bool { return t.deposed.Load() }

// close stops everything the tenure started.
func (t *tenure) close() {
	for _, s := range t.subs {
		_ = s.Unsubscribe()
	}
	t.cancel()
	if t.bc != nil {
		t.bc.Close()
	}
	t.wg.Wait()
}
