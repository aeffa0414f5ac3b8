package recovery

import (
	"context"
	"errors"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/streamwal/streamwal"
	walbackend "github.com/streamwal/streamwal/jetstream"
)

// kvStore is a [Store] over a JetStream KV bucket.
type kvStore struct {
	kv jetstream.KeyValue
}

// NewKV returns a [Store] over a JetStream KV bucket, normally the one
// [OpenBucket] opens. Put creates the key when rev is 0 and updates it
// at revision rev otherwise; a revision mismatch matches ErrConflict, an
// invalid key streamwal.ErrInvalidArgument, and every other failure
// (connection, timeout, server) streamwal.ErrUnavailable.
func NewKV(kv jetstream.KeyValue) Store { return &kvStore{kv: kv} }

// Get implements [Store].
func (s *kvStore) Get(ctx context.Context, key string) ([]byte, uint64, error) {
	e, err := s.kv.Get(ctx, key)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound), errors.Is(err, jetstream.ErrKeyDeleted):
		return nil, 0, notFound(key)
	case err != nil:
		return nil, 0, kvError("get", key, err)
	}
	return e.Value(), e.Revision(), nil
}

// Put implements [Store].
func (s *kvStore) Put(ctx context.Context, key string, value []byte, rev uint64) (uint64, error) {
	var (
		next uint64
		err  error
	)
	if rev == 0 {
		next, err = s.kv.Create(ctx, key, value)
	} else {
		next, err = s.kv.Update(ctx, key, value, rev)
	}
	switch {
	case err == nil:
		return next, nil
	case isConflict(err):
		return 0, conflict(key, rev)
	}
	return 0, kvError("put", key, err)
}

// Delete implements [Store].
func (s *kvStore) Delete(ctx context.Context, key string) error {
	if err := s.kv.Delete(ctx, key); err != nil {
		return kvError("delete", key, err)
	}
	return nil
}

// isConflict reports whether err is a refused compare-and-set: the key
// exists (Create) or has another revision (Update).
func isConflict(err error) bool {
	if errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
		return true
	}
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant)
}

// kvError maps a failed KV operation: an invalid key is the caller's
// mistake, anything else is worth a retry.
func kvError(op, key string, err error) error {
	if errors.Is(err, jetstream.ErrInvalidKey) {
		return streamwal.Errorf(streamwal.CodeInvalidArgument, "%s %s: %w", op, key, err)
	}
	return unavailable(op, key, err)
}

// unavailable wraps a failure of the storage as retriable.
func unavailable(op, key string, err error) error {
	return streamwal.Errorf(streamwal.CodeUnavailable, "%s %s: %w", op, key, err)
}

// BucketOption adjusts the configuration [OpenBucket] creates a missing
// bucket with.
type BucketOption func(*jetstream.KeyValueConfig)

// WithReplicas sets the replica count of a bucket OpenBucket creates
// (default 1).
func WithReplicas(n int) BucketOption {
	return func(c *jetstream.KeyValueConfig) { c.Replicas = n }
}

// OpenBucket opens cluster c's checkpoints bucket, creating it when
// missing with history 1 and file storage. An existing bucket is opened
// as it is, never reconfigured: the coordinator provisions the cluster's
// buckets (with their replica count), and a node must not scale them down.
//
// Each attempt is bounded and made again, until ctx ends, when it goes
// unanswered (see jetstream.InAttempts: two nodes, or a node and a
// coordinator, starting at once on a new cluster).
func OpenBucket(ctx context.Context, js jetstream.JetStream, c streamwal.Cluster, opts ...BucketOption) (jetstream.KeyValue, error) {
	cfg := jetstream.KeyValueConfig{Bucket: c.BucketName(streamwal.BucketCheckpoints), History: 1, Storage: jetstream.FileStorage}
	for _, o := range opts {
		o(&cfg)
	}
	var kv jetstream.KeyValue
	err := walbackend.InAttempts(ctx, func(ctx context.Context) (err error) {
		kv, err = openBucket(ctx, js, cfg)
		return err
	})
	if err != nil {
		return nil, streamwal.Errorf(streamwal.CodeUnavailable, "open bucket %s: %w", cfg.Bucket, err)
	}
	return kv, nil
}

// openBucket opens cfg's bucket, creating it when missing.
func openBucket(ctx context.Context, js jetstream.JetStream, cfg jetstream.KeyValueConfig) (jetstream.KeyValue, error) {
	kv, err := js.KeyValue(ctx, cfg.Bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		kv, err = js.CreateKeyValue(ctx, cfg)
		if errors.Is(err, jetstream.ErrBucketExists) { // created meanwhile by someone else
			kv, err = js.KeyValue(ctx, cfg.Bucket)
		}
	}
	return kv, err
}
