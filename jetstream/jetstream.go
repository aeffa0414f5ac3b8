package jetstream

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	njs "github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/logging"
	"github.com/streamwal/streamwal/messages"
)

// JetStream is the Backend on NATS JetStream. It is safe for concurrent use.
type JetStream struct {
	nc    *nats.Conn
	js    njs.JetStream
	codec *messages.Codec
	opts  Options
	log   zerolog.Logger

	mu          sync.Mutex
	provisioned map[streamwal.PChannel]bool
	exists      map[streamwal.PChannel]bool // found by a reader, not provisioned
	closed      bool
	// indexes caches the archive index of each PChannel read last.
	indexes map[streamwal.PChannel]cachedIndex
	// archiveMu serializes the truncations of each PChannel.
	archiveMu map[streamwal.PChannel]*sync.Mutex
	// recent is the archived object read last by Get.
	recent recentObject

	objMu  sync.Mutex
	obs    njs.ObjectStore
	shrunk bool // the object store's duplicate window was set (see writableObjects)
}

var _ Backend = (*JetStream)(nil)

// New returns a backend that writes p's stream as codec.Cluster() names it,
// over nc. The caller keeps ownership of nc.
func New(nc *nats.Conn, codec *messages.Codec, opts Options) (*JetStream, error) {
	if nc == nil || codec == nil {
		return nil, invalidArg("jetstream backend needs a connection and a codec")
	}
	opts = opts.withDefaults(codec)
	if err := opts.validate(); err != nil {
		return nil, err
	}
	js, err := njs.New(nc)
	if err != nil {
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	return &JetStream{
		nc: nc, js: js, codec: codec, opts: opts,
		log:         logging.Component(opts.Logger, "wal-backend"),
		provisioned: map[streamwal.PChannel]bool{}, exists: map[streamwal.PChannel]bool{},
		indexes:   map[streamwal.PChannel]cachedIndex{},
		archiveMu: map[streamwal.PChannel]*sync.Mutex{},
	}, nil
}

// Codec returns the backend's codec.
func (b *JetStream) Codec() *messages.Codec { return b.codec }

// Options returns the effective options.
func (b *JetStream) Options() Options { return b.opts }

// streamConfig is the configuration of p's stream.
func (b *JetStream) streamConfig(p streamwal.PChannel) njs.StreamConfig {
	c := b.codec.Cluster()
	return njs.StreamConfig{
		Name:               c.StreamName(p),
		Description:        "streamwal PChannel " + p.String() + " of cluster " + string(c),
		Subjects:           c.StreamSubjects(p),
		Storage:            b.opts.storage(),
		Replicas:           b.opts.Replicas,
		Retention:          njs.LimitsPolicy,
		Discard:            njs.DiscardNew,
		MaxMsgs:            -1,
		MaxBytes:           -1,
		MaxAge:             0,
		MaxMsgSize:         b.opts.MaxMsgSize,
		Duplicates:         b.opts.DuplicateWindow,
		AllowDirect:        true,
		AllowAtomicPublish: true,
		DenyDelete:         true,
	}
}

// Provision creates p's stream, or updates it to the backend's options,
// except that it never lowers the replicas of a stream that exists (an
// invalid-argument error says how many it has). It is idempotent.
func (b *JetStream) Provision(ctx context.Context, p streamwal.PChannel) error {
	if err := b.checkOpen(p); err != nil {
		return err
	}
	b.mu.Lock()
	done := b.provisioned[p]
	b.mu.Unlock()
	if done {
		return nil
	}
	cfg := b.streamConfig(p)
	err := InAttempts(ctx, func(ctx context.Context) error {
		for {
			if s, err := b.js.Stream(ctx, cfg.Name); err == nil && s.CachedInfo().Config.Replicas > cfg.Replicas {
				// A node started with the default of 1 on a cluster whose
				// streams keep 3 would otherwise scale them down to one copy.
				have := s.CachedInfo().Config.Replicas
				return streamwal.Errorf(streamwal.CodeInvalidArgument,
					"stream %s of %s has %d replicas and this backend keeps %d: refusing to scale it down (run with %d replicas)", cfg.Name, p, have, cfg.Replicas, have)
			}
			_, err := b.js.CreateOrUpdateStream(ctx, cfg)
			if !errors.Is(err, njs.ErrStreamNameAlreadyInUse) {
				return err
			}
			// Created by another process at this moment (the update
			// did not find it, the creation did): look again.
			if err := pause(ctx); err != nil {
				return err
			}
		}
	})
	if err != nil {
		var se *streamwal.Error
		if errors.As(err, &se) {
			return err
		}
		return classify(fmt.Errorf("provision stream of %s: %w", p, err))
	}
	b.mu.Lock()
	b.provisioned[p] = true
	b.mu.Unlock()
	return nil
}

// ensure makes sure p's stream exists for a reader: it creates a missing
// one with the backend's options, but never changes one that exists
// (another process's writer owns its configuration, its replicas say).
func (b *JetStream) ensure(ctx context.Context, p streamwal.PChannel) error {
	if err := b.checkOpen(p); err != nil {
		return err
	}
	b.mu.Lock()
	done := b.provisioned[p] || b.exists[p]
	b.mu.Unlock()
	if done {
		return nil
	}
	err := InAttempts(ctx, func(ctx context.Context) error {
		created := false
		for {
			_, err := b.js.Stream(ctx, b.codec.Cluster().StreamName(p))
			if !errors.Is(err, njs.ErrStreamNotFound) {
				return err
			}
			if !created {
				_, err = b.js.CreateStream(ctx, b.streamConfig(p))
				if err != nil && !errors.Is(err, njs.ErrStreamNameAlreadyInUse) {
					return err
				}
				created = err == nil
			}
			// Just created, here or by another process: a cluster's
			// servers may not all know it yet. Look until it is there.
			if err := pause(ctx); err != nil {
				return err
			}
		}
	})
	if err != nil {
		return classify(fmt.Errorf("stream of %s: %w", p, err))
	}
	b.mu.Lock()
	b.exists[p] = true
	b.mu.Unlock()
	return nil
}

// Bounds of one attempt of InAttempts: attemptTime plus a random part of
// attemptJitter, so that two processes whose creations collided do not
// collide again.
const (
	attemptTime   = 2 * time.Second
	attemptJitter = 2 * time.Second
)

// InAttempts runs fn, which opens or creates a stream or bucket, in
// attempts of bounded time (2 to 4 s), again while one goes unanswered
// (ends with context.DeadlineExceeded) and ctx lasts: nats-server 2.15.2
// often answers neither of two equal creations of a replicated stream
// that arrive together (two nodes, or coordinators, started at once),
// though it creates the stream, which the next attempt then finds; without
// a bound both would wait out their whole deadline. The backend's own
// creations use it, and so do the coordinator's and the checkpoint store's
// buckets.
func InAttempts(ctx context.Context, fn func(context.Context) error) error {
	for {
		actx, cancel := context.WithTimeout(ctx, attemptTime+rand.N(attemptJitter))
		err := fn(actx)
		cancel()
		if err == nil || ctx.Err() != nil || !errors.Is(err, context.DeadlineExceeded) {
			return err
		}
	}
}

// pause waits a moment before looking again for what another process is
// creating, or until ctx ends.
func pause(ctx context.Context) error {
	t := time.NewTimer(50*time.Millisecond + rand.N(50*time.Millisecond))
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// checkOpen refuses a closed backend or a zero PChannel.
func (b *JetStream) checkOpen(p streamwal.PChannel) error {
	b.mu.Lock()
	closed := b.closed
	b.mu.Unlock()
	if closed {
		return streamwal.Errorf(streamwal.CodeClosed, "jetstream backend is closed")
	}
	if p.IsZero() {
		return invalidArg("zero pchannel")
	}
	if len(b.opts.PChannels) > 0 && !slices.Contains(b.opts.PChannels, p) {
		return invalidArg("unknown pchannel %s: this backend serves %d pchannels", p, len(b.opts.PChannels))
	}
	return nil
}

// Read returns an ordered-consumer scanner over p.
func (b *JetStream) Read(ctx context.Context, p streamwal.PChannel, opts ReadOptions) (Scanner, error) {
	if err := b.checkOpen(p); err != nil {
		return nil, err
	}
	if err := opts.Start.validate(); err != nil {
		return nil, err
	}
	if err := b.checkFilters(p, opts.Filters); err != nil {
		return nil, err
	}
	if slices.Contains(opts.Whole, nil) {
		return nil, invalidArg("read %s: a nil type among those to read whole", p)
	}
	if err := b.ensure(ctx, p); err != nil {
		return nil, err
	}
	if opts.Start.Kind == StartLatest {
		// An ordered consumer re-created after a reconnect before it
		// delivered anything would start "new" again and skip what was
		// appended meanwhile: pin the start to a sequence instead.
		s, err := b.js.Stream(ctx, b.codec.Cluster().StreamName(p))
		if err != nil {
			return nil, classify(fmt.Errorf("read %s: %w", p, err))
		}
		opts.Start = After(messages.MessageID(s.CachedInfo().State.LastSeq))
	} else if b.opts.Archive {
		return b.readStreamOrArchive(ctx, p, opts)
	}
	return newScanner(ctx, b, p, opts)
}

// ErrNotStored: no message is stored at the MessageID asked for.
var ErrNotStored = errors.New("no message stored at that id")

// Get implements Backend. With Options.Archive, a message truncated from
// the stream is read from the archive.
func (b *JetStream) Get(ctx context.Context, p streamwal.PChannel, id messages.MessageID) (*messages.ImmutableMessage, error) {
	if err := b.checkOpen(p); err != nil {
		return nil, err
	}
	if id == 0 {
		return nil, invalidArg("get message id 0: %w", ErrNotStored)
	}
	s, err := b.js.Stream(ctx, b.codec.Cluster().StreamName(p))
	if err != nil {
		return nil, classify(fmt.Errorf("get %s/%d: %w", p, id, err))
	}
	raw, err := s.GetMsg(ctx, uint64(id))
	if errors.Is(err, njs.ErrMsgNotFound) && b.opts.Archive {
		m, err := b.archivedGet(ctx, p, id)
		if m != nil || err != nil {
			return m, err
		}
	}
	if errors.Is(err, njs.ErrMsgNotFound) {
		return nil, invalidArg("get %s/%d: %w", p, id, ErrNotStored)
	}
	if err != nil {
		return nil, classify(fmt.Errorf("get %s/%d: %w", p, id, err))
	}
	return b.codec.Decode(&nats.Msg{Subject: raw.Subject, Header: raw.Header, Data: raw.Data}, id)
}

// checkFilters refuses filters outside p's subjects.
func (b *JetStream) checkFilters(p streamwal.PChannel, filters []string) error {
	root := b.codec.Cluster().StreamSubjects(p)[0]
	prefix := root[:len(root)-1]
	for _, f := range filters {
		if len(f) <= len(prefix) || f[:len(prefix)] != prefix {
			return invalidArg("filter %q is not a subject of %s (%s)", f, p, root)
		}
	}
	return nil
}

// Truncate removes every message of p below id, except the newest
// RecoveryBarrier, which fences earlier writers and must stay. With
// Options.Archive it first archives what it removes (see the package doc,
// Tiered storage) and never removes a message appended after it started.
func (b *JetStream) Truncate(ctx context.Context, p streamwal.PChannel, below messages.MessageID) error {
	if err := b.checkOpen(p); err != nil {
		return err
	}
	if below == 0 {
		return invalidArg("truncate below message id 0")
	}
	s, err := b.stream(ctx, p)
	if err != nil {
		return err
	}
	l := b.archiveLock(p)
	l.Lock()
	defer l.Unlock()
	if b.opts.Archive {
		if below, err = b.archiveBelow(ctx, s, p, below, false); err != nil || below == 0 {
			return err
		}
	}
	return b.purgeBelow(ctx, s, p, below)
}

// stream provisions p's stream and returns it.
func (b *JetStream) stream(ctx context.Context, p streamwal.PChannel) (njs.Stream, error) {
	if err := b.Provision(ctx, p); err != nil {
		return nil, err
	}
	s, err := b.js.Stream(ctx, b.codec.Cluster().StreamName(p))
	if err != nil {
		return nil, classify(fmt.Errorf("stream of %s: %w", p, err))
	}
	return s, nil
}

// purgeBelow purges every message of p below id but the newest barrier.
func (b *JetStream) purgeBelow(ctx context.Context, s njs.Stream, p streamwal.PChannel, below messages.MessageID) error {
	for _, f := range b.truncateFilters(p) {
		if err := s.Purge(ctx, njs.WithPurgeSubject(f), njs.WithPurgeSequence(uint64(below))); err != nil {
			return classify(fmt.Errorf("truncate %s below %d (%s): %w", p, below, f, err))
		}
	}
	newest, err := b.newestBarrier(ctx, s, p)
	if err != nil {
		return err
	}
	if keepFrom := min(uint64(below), newest.seq); keepFrom > 1 {
		if err := s.Purge(ctx, njs.WithPurgeSubject(b.barrierSubject(p)), njs.WithPurgeSequence(keepFrom)); err != nil {
			return classify(fmt.Errorf("truncate old barriers of %s: %w", p, err))
		}
	}
	return nil
}

// truncateFilters are the subjects truncation purges by sequence: every
// VChannel subject and every PChannel-level type but the barrier.
func (b *JetStream) truncateFilters(p streamwal.PChannel) []string {
	c := b.codec.Cluster()
	filters := []string{c.AllVChannelsFilter(p)}
	for _, t := range b.codec.Registry().Types() {
		if t.Dispatch.PChannelLevel() && t != messages.TypeRecoveryBarrier {
			filters = append(filters, c.PChannelSubject(p, t.Token))
		}
	}
	return filters
}

// barrierSubject is the subject of p's RecoveryBarriers.
func (b *JetStream) barrierSubject(p streamwal.PChannel) string {
	return b.codec.Cluster().PChannelSubject(p, messages.TypeRecoveryBarrier.Token)
}

// Close marks the backend closed; open writers and scanners are unaffected.
func (b *JetStream) Close() error {
	b.mu.Lock()
	b.closed = true
	b.mu.Unlock()
	return nil
}

// classify maps NATS errors onto streamwal codes.
func classify(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return err
	case errors.Is(err, nats.ErrNoResponders), errors.Is(err, njs.ErrNoStreamResponse),
		errors.Is(err, nats.ErrTimeout), errors.Is(err, nats.ErrConnectionClosed),
		errors.Is(err, nats.ErrConnectionReconnecting), errors.Is(err, nats.ErrDisconnected),
		// An object store read whose chunks stop arriving in time (a
		// busy or restarting server) times out on its pipe.
		errors.Is(err, os.ErrDeadlineExceeded):
		return streamwal.Errorf(streamwal.CodeUnavailable, "%w", err)
	}
	var se *streamwal.Error
	if errors.As(err, &se) {
		return err
	}
	return streamwal.Errorf(streamwal.CodeInternal, "%w", err)
}
