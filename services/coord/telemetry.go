package coord

import (
	"context"
	"errors"
	"fmt"
	"time"

	njs "github.com/nats-io/nats.go/jetstream"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/services/wire"
	"github.com/streamwal/streamwal/telemetry"
)

// ErrNotReady is wrapped by Ready's errors.
var ErrNotReady = errors.New("not ready")

// Ready reports whether the coordinator does its part: it is active and
// its lease surely holds, or it is a healthy standby, one whose last
// attempt at the lease was answered (the lease is held by another) within
// the lease's TTL.
func (c *Coordinator) Ready() error {
	if _, active := c.Active(); active && c.leaseHeld() {
		return nil
	}
	last := time.Unix(0, c.answered.Load())
	if age := time.Since(last); c.answered.Load() == 0 || age > c.cfg.LeaseTTL {
		return fmt.Errorf("%w: coordinator %s is not active and its lease bucket has not answered for %s", ErrNotReady, c.cfg.ID, age.Round(time.Millisecond))
	}
	return nil
}

// noteAnswered records that a lease round was answered (err is the
// answer: nil, or the lease held by another).
func (c *Coordinator) noteAnswered(err error) {
	if err == nil || errors.Is(err, njs.ErrKeyExists) {
		c.answered.Store(time.Now().UnixNano())
	}
}

// stuckWarning is how often the coordinator repeats its warning while
// broadcasts are stuck.
const stuckWarning = 10 * time.Second

// noteStuck reports the stuck broadcasts, and warns of them every
// stuckWarning while there are any.
func (ctl *control) noteStuck() {
	if ctl.t.bc == nil {
		return
	}
	n := int(ctl.t.bc.Stuck())
	ctl.t.c.cfg.Hooks.OnBroadcastStuck(telemetry.BroadcastStuckEvent{Stuck: n})
	if n > 0 && time.Since(ctl.stuckWarned) > stuckWarning {
		ctl.stuckWarned = time.Now()
		ctl.t.log.Warn().Int("stuck", n).Msg("broadcasts stuck: a target refused them for good; they hold their resource keys until an operator acts")
	}
}

// handleTSO serves an allocation request (allocateTSO) and reports it.
func (t *tenure) handleTSO(ctx context.Context, req wire.TSORequest) (wire.TSOReply, error) {
	reply, err := t.allocateTSO(ctx, req)
	t.c.cfg.Hooks.OnTSO(telemetry.TSOEvent{Count: req.Count, Err: err})
	return reply, err
}

// handleBroadcast serves a broadcast request (runBroadcast) and reports
// it.
func (t *tenure) handleBroadcast(ctx context.Context, req wire.BroadcastRequest) (wire.BroadcastReply, error) {
	start := time.Now()
	reply, err := t.runBroadcast(ctx, req)
	took := time.Since(start)
	t.c.cfg.Hooks.OnBroadcast(telemetry.BroadcastEvent{Type: req.Type, Targets: len(req.VChannels), Took: took, Err: err})
	return reply, err
}

// logRequest logs a request of op that ended with err: at warn when it
// failed, at debug when it was refused.
func (t *tenure) logRequest(op streamwal.CoordOp, err error) {
	if err == nil {
		return
	}
	code := streamwal.CodeOf(err)
	if telemetry.IsFailure(code) {
		t.log.Warn().Err(err).Str("op", string(op)).Str("code", string(code)).Msg("request failed")
		return
	}
	t.log.Debug().Err(err).Str("op", string(op)).Str("code", string(code)).Msg("request refused")
}
