package coord

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	njs "github.com/nats-io/nats.go/jetstream"

	"github.com/streamwal/streamwal"
)

// errDeposed: a write was refused because another coordinator wrote the
// key since this one read it; this one is no longer active.
var errDeposed = errors.New("coordinator deposed")

// deposed wraps errDeposed as a retriable error for callers.
func deposed(key string) error {
	return streamwal.Errorf(streamwal.CodeUnavailable, "write of %s refused: %w", key, errDeposed)
}

// store reads and writes one bucket's keys with compare-and-set on the
// revision this coordinator last saw. A coordinator rewrites every key it
// owns when it takes over, so from then on a deposed coordinator's writes
// are refused.
type store struct {
	kv   njs.KeyValue
	mu   sync.Mutex
	revs map[string]uint64
}

// newStore wraps a bucket.
func newStore(kv njs.KeyValue) *store { return &store{kv: kv, revs: map[string]uint64{}} }

// load reads key into out and remembers its revision; found is false when
// the key does not exist.
func (s *store) load(ctx context.Context, key string, out any) (bool, error) {
	e, err := s.kv.Get(ctx, key)
	if errors.Is(err, njs.ErrKeyNotFound) {
		s.setRev(key, 0)
		return false, nil
	}
	if err != nil {
		return false, streamwal.Errorf(streamwal.CodeUnavailable, "read %s: %v", key, err)
	}
	if err := json.Unmarshal(e.Value(), out); err != nil {
		return false, streamwal.Errorf(streamwal.CodeUnrecoverable, "decode %s: %v", key, err)
	}
	s.setRev(key, e.Revision())
	return true, nil
}

// put writes value at key, conditioned on the revision last seen (or on
// the key not existing).
func (s *store) put(ctx context.Context, key string, value any) error {
	data, err := json.Marshal(value)
	if err != nil {
		return fmt.Errorf("encode %s: %w", key, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	rev := s.revs[key]
	if rev == 0 {
		rev, err = s.kv.Create(ctx, key, data)
	} else {
		rev, err = s.kv.Update(ctx, key, data, rev)
	}
	if err != nil {
		var apiErr *njs.APIError
		if errors.Is(err, njs.ErrKeyExists) || errors.Is(err, njs.ErrKeyRevisionMismatch) ||
			errors.As(err, &apiErr) && apiErr.ErrorCode == njs.JSErrCodeStreamWrongLastSequence {
			return deposed(key)
		}
		s.adopt(ctx, key, data)
		return streamwal.Errorf(streamwal.CodeUnavailable, "write %s: %v", key, err)
	}
	s.revs[key] = rev
	return nil
}

// adopt learns the revision of a write whose answer was lost: if the
// stored value is the one written, the next write is conditioned on it;
// otherwise the remembered revision stays, and a successor's write shows
// as a deposition. Called with s.mu held.
func (s *store) adopt(ctx context.Context, key string, data []byte) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	defer cancel()
	if e, err := s.kv.Get(ctx, key); err == nil && bytes.Equal(e.Value(), data) {
		s.revs[key] = e.Revision()
	}
}

// setRev remembers a revision.
func (s *store) setRev(key string, rev uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.revs[key] = rev
}

// delete removes key, conditioned on the revision last seen.
func (s *store) delete(ctx context.Context, key string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	rev := s.revs[key]
	var opts []njs.KVDeleteOpt
	if rev != 0 {
		opts = append(opts, njs.LastRevision(rev))
	}
	if err := s.kv.Delete(ctx, key, opts...); err != nil {
		var apiErr *njs.APIError
		if errors.Is(err, njs.ErrKeyRevisionMismatch) || errors.As(err, &apiErr) && apiErr.ErrorCode == njs.JSErrCodeStreamWrongLastSequence {
			return deposed(key)
		}
		return streamwal.Errorf(streamwal.CodeUnavailable, "delete %s: %v", key, err)
	}
	delete(s.revs, key)
	return nil
}
