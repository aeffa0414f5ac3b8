package recovery

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/messages"
)

// AcceptLoss is an operator's consent, recorded by `streamwal pchannel
// accept-loss`, to serve a PChannel although its stream lost history the
// checkpoint says was handed out: the owner may open with what is stored
// above Above.
type AcceptLoss struct {
	// Above is the MessageID above which the stream is served as it is.
	Above messages.MessageID `json:"above"`
	// By names the operator.
	By string `json:"by,omitempty"`
	// At is when the consent was given.
	At time.Time `json:"at"`
}

// ReadAcceptLoss returns p's accept-loss record; found is false when none
// is stored.
func ReadAcceptLoss(ctx context.Context, s Store, p streamwal.PChannel) (a AcceptLoss, found bool, err error) {
	key := streamwal.AcceptLossKey(p)
	raw, _, err := s.Get(ctx, key)
	if errors.Is(err, ErrNotFound) {
		return AcceptLoss{}, false, nil
	}
	if err != nil {
		return AcceptLoss{}, false, streamwal.Errorf(unknownCode(err), "read %s: %w", key, err)
	}
	if err := decodeObject(raw, &a); err != nil {
		return AcceptLoss{}, false, corrupt(key, err)
	}
	return a, true, nil
}

// WriteAcceptLoss stores a as p's accept-loss record, replacing any.
func WriteAcceptLoss(ctx context.Context, s Store, p streamwal.PChannel, a AcceptLoss) error {
	key := streamwal.AcceptLossKey(p)
	value, err := json.Marshal(a)
	if err != nil {
		return streamwal.Errorf(streamwal.CodeInvalidArgument, "encode %s: %v", key, err)
	}
	for range maxAttempts {
		_, rev, err := s.Get(ctx, key)
		if err != nil && !errors.Is(err, ErrNotFound) {
			return streamwal.Errorf(unknownCode(err), "read %s: %w", key, err)
		}
		_, err = s.Put(ctx, key, value, rev)
		if !errors.Is(err, ErrConflict) {
			return writeError(key, err)
		}
	}
	return streamwal.Errorf(streamwal.CodeUnavailable, "write %s: still changing after %d attempts", key, maxAttempts)
}

// ClearAcceptLoss removes p's accept-loss record; clearing none is not an
// error.
func ClearAcceptLoss(ctx context.Context, s Store, p streamwal.PChannel) error {
	key := streamwal.AcceptLossKey(p)
	if err := s.Delete(ctx, key); err != nil {
		return streamwal.Errorf(unknownCode(err), "delete %s: %w", key, err)
	}
	return nil
}

// writeError wraps a failed write (nil stays nil).
func writeError(key string, err error) error {
	if err == nil {
		return nil
	}
	return streamwal.Errorf(unknownCode(err), "write %s: %w", key, err)
}
