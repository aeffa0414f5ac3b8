package node

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"time"

	njs "github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/messages"
	"github.com/streamwal/streamwal/services/wire"
)

// DefaultSubscriptionExpiry is how long a durable subscription's position
// holds the log without an acknowledgement when the position names no
// expiry of its own (RecoveryOptions.SubscriptionExpiry).
const DefaultSubscriptionExpiry = 7 * 24 * time.Hour

// holdsRetry is how long the holds watcher waits before it looks for the
// subscriptions bucket again, or watches it again after its watch ended.
const holdsRetry = 2 * time.Second

// subscriptionHolds keeps the durable subscriptions' positions (the
// subscriptions bucket, watched) so that each WAL's truncation asks,
// without a request, the smallest MessageID they still need on its
// PChannel (wal.Storage.Holds). Until it has read the bucket whole it
// holds everything: a truncation never runs ahead of what it has not
// seen. A position idle past its expiry stops holding, with a log line.
type subscriptionHolds struct {
	kvName string
	expiry time.Duration // negative: never
	log    zerolog.Logger

	mu      sync.Mutex
	ready   bool
	pos     map[string]wire.SubscriptionPosition // by key
	expired map[string]time.Time                 // keys logged as expired, with their Acked
}

// newSubscriptionHolds watches the subscriptions bucket of cluster c.
func newSubscriptionHolds(c streamwal.Cluster, expiry time.Duration, log zerolog.Logger) *subscriptionHolds {
	if expiry == 0 {
		expiry = DefaultSubscriptionExpiry
	}
	return &subscriptionHolds{kvName: c.BucketName(streamwal.BucketSubscriptions), expiry: expiry,
		log: log.With().Str("bucket", c.BucketName(streamwal.BucketSubscriptions)).Logger(),
		pos: map[string]wire.SubscriptionPosition{}, expired: map[string]time.Time{}}
}

// For is wal.Storage.Holds for p.
func (h *subscriptionHolds) For(p streamwal.PChannel) func() messages.MessageID {
	return func() messages.MessageID { return h.hold(p, time.Now()) }
}

// hold is the smallest MessageID the live positions on p need (0: none;
// 1 while the bucket has not been read whole).
func (h *subscriptionHolds) hold(p streamwal.PChannel, now time.Time) messages.MessageID {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.ready {
		return 1
	}
	var low messages.MessageID
	for key, pos := range h.pos {
		v, err := streamwal.ParseVChannel(pos.VChannel)
		if err != nil || v.PChannel() != p {
			continue
		}
		if h.expiredLocked(key, pos, now) {
			continue
		}
		if from := max(pos.From, 1); low == 0 || from < low {
			low = from
		}
	}
	return low
}

// expiredLocked reports whether pos is idle past its expiry, and logs it
// the first time.
func (h *subscriptionHolds) expiredLocked(key string, pos wire.SubscriptionPosition, now time.Time) bool {
	expiry := pos.Expiry
	if expiry == 0 {
		expiry = h.expiry
	}
	if expiry < 0 || now.Sub(pos.Acked) <= expiry {
		return false
	}
	if at, logged := h.expired[key]; !logged || !at.Equal(pos.Acked) {
		h.expired[key] = pos.Acked
		h.log.Warn().Str("key", key).Str("vchannel", pos.VChannel).Uint64("from", uint64(pos.From)).
			Time("acked", pos.Acked).Dur("expiry", expiry).
			Msg("durable subscription position idle past its expiry: it no longer holds the log")
	}
	return true
}

// run watches the bucket until ctx ends.
func (h *subscriptionHolds) run(ctx context.Context, js njs.JetStream) {
	warned := false
	follow(ctx, holdsRetry, func(ctx context.Context) error {
		kv, err := js.KeyValue(ctx, h.kvName)
		if err == nil {
			err = h.watch(ctx, kv)
		}
		return err
	}, func(err error) {
		if !warned || !errors.Is(err, njs.ErrBucketNotFound) {
			h.log.Warn().Err(err).Msg("durable subscription positions unread: truncation waits")
			warned = true
		}
	})
}

// watch follows the positions until the watch or ctx ends.
func (h *subscriptionHolds) watch(ctx context.Context, kv njs.KeyValue) error {
	w, err := kv.Watch(ctx, streamwal.SubscriptionPositionPrefix+">")
	if err != nil {
		return err
	}
	defer func() { _ = w.Stop() }()
	seen := map[string]wire.SubscriptionPosition{}
	ready := false
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case e, ok := <-w.Updates():
			if !ok {
				return errors.New("watch of the subscription positions ended")
			}
			if e == nil {
				ready = true
				h.replace(seen)
				continue
			}
			h.apply(e, seen, ready)
		}
	}
}

// apply records one update of the watch: into seen while the initial
// values arrive, into the live set after.
func (h *subscriptionHolds) apply(e njs.KeyValueEntry, seen map[string]wire.SubscriptionPosition, ready bool) {
	key := e.Key()
	var pos wire.SubscriptionPosition
	put := e.Operation() == njs.KeyValuePut && json.Unmarshal(e.Value(), &pos) == nil &&
		strings.HasPrefix(key, streamwal.SubscriptionPositionPrefix)
	if !ready {
		if put {
			seen[key] = pos
		} else {
			delete(seen, key)
		}
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if put {
		h.pos[key] = pos
		return
	}
	delete(h.pos, key)
	h.log.Info().Str("key", key).Msg("durable subscription position deleted: it no longer holds the log")
}

// replace installs the initial values of a watch.
func (h *subscriptionHolds) replace(seen map[string]wire.SubscriptionPosition) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.pos = seen
	h.ready = true
}

// watchHolds runs the node's subscription holds until it stops.
func (n *Node) watchHolds() {
	defer n.loops.Done()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-n.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	js, err := njs.New(n.cfg.Conn)
	if err != nil {
		n.log.Error().Err(err).Msg("durable subscription positions unread: truncation waits")
		return
	}
	n.holds.run(ctx, js)
}
