package recovery

import (
	"bytes"
	"encoding/json"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/streamwal/streamwal"
)

// FuzzLoad stores arbitrary bytes under one of a PChannel's keys: Load
// (and ReadAcceptLoss) must return a typed error or a snapshot that a
// claim stores again unchanged, never panic.
func FuzzLoad(f *testing.F) {
	for _, seed := range []string{
		`{"term":1,"timetick":5,"message_id":2,"consumed":3,"digest":"ab","reached":4,"written":"2026-01-02T03:04:05Z"}`,
		`{"term":1,"timetick":5,"vchannels":[{"vchannel":"pchan-3_42v0","collection_id":42,"state":"normal","partitions":[1]}]}`,
		`{"term":1,"timetick":5,"segments":[{"id":1}]}`,
		`{"term":1,"segments":null}`,
		`{"above":3,"by":"ops","at":"2026-01-02T03:04:05Z"}`,
		`{"term":99}`, `{}`, `null`, `[]`, `"x"`, `{"term":-1}`, `{"term":1.5}`, `{"term":1}{}`,
		`{"vchannels":[{"state":"gone"}]}`, `{"vchannels":{}}`, `{"replication":[1,2]}`, `{"written":"yesterday"}`,
		"\x00\xff", ``,
	} {
		for k := range byte(4) {
			f.Add(k, []byte(seed))
		}
	}
	f.Fuzz(func(t *testing.T, which byte, data []byte) {
		p := pch(t, 3)
		keys := append(keysOf(p), streamwal.AcceptLossKey(p))
		key := keys[int(which)%len(keys)]
		s := NewMemory()
		_, err := s.Put(testCtx(t), key, data, 0)
		require.NoError(t, err)

		if key == streamwal.AcceptLossKey(p) {
			if _, _, err := ReadAcceptLoss(testCtx(t), s, p); err != nil {
				requireCorrupt(t, err)
			}
			return
		}
		o := NewPersister(s, p, 10, "n")
		got, _, err := o.Load(testCtx(t))
		if err != nil {
			if !errors.Is(err, streamwal.ErrFenced) {
				requireCorrupt(t, err)
			}
			require.Error(t, o.Claim(testCtx(t)), "a failed Load allows no claim")
			stored, _ := raw(t, s, key)
			require.Equal(t, data, stored)
			return
		}
		require.NoError(t, o.Claim(testCtx(t)))
		again, _, err := NewPersister(s, p, 11, "n").Load(testCtx(t))
		require.NoError(t, err, "a claimed value loads")
		requireSameSnapshot(t, got, again)
	})
}

// requireCorrupt checks the error of an undecodable value.
func requireCorrupt(t *testing.T, err error) {
	t.Helper()
	require.ErrorIs(t, err, ErrCorrupt)
	require.Equal(t, streamwal.CodeUnrecoverable, streamwal.CodeOf(err))
}

// requireSameSnapshot compares what two loads found, but for who wrote
// the checkpoint and when.
func requireSameSnapshot(t *testing.T, a, b Snapshot) {
	t.Helper()
	for _, s := range []*Snapshot{&a, &b} {
		s.Checkpoint.Term, s.Checkpoint.Node = 0, ""
		s.Checkpoint.Written = s.Checkpoint.Written.UTC()
		s.Checkpoint.Written = b.Checkpoint.Written
		s.Checkpoint.Replication = compact(t, s.Checkpoint.Replication)
		s.Segments = compact(t, s.Segments)
		if len(s.VChannels) == 0 {
			s.VChannels = nil
		}
	}
	require.Equal(t, a, b)
}

// compact returns raw JSON without insignificant spaces (nil stays nil).
func compact(t *testing.T, raw json.RawMessage) json.RawMessage {
	t.Helper()
	if raw == nil {
		return nil
	}
	var b bytes.Buffer
	require.NoError(t, json.Compact(&b, raw))
	return b.Bytes()
}
