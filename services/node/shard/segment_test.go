package shard_test

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/services/node/shard"
)

func TestStateNamesAndJSON(t *testing.T) {
	for st, name := range map[shard.State]string{shard.Growing: "growing", shard.Sealed: "sealed", shard.Flushed: "flushed"} {
		require.Equal(t, name, st.String())
		b, err := json.Marshal(st)
		require.NoError(t, err)
		require.Equal(t, `"`+name+`"`, string(b))
		var back shard.State
		require.NoError(t, json.Unmarshal(b, &back))
		require.Equal(t, st, back)
	}
	require.Equal(t, "invalid", shard.State(0).String())
	_, err := json.Marshal(shard.State(9))
	require.Error(t, err)
	var st shard.State
	require.Error(t, json.Unmarshal([]byte(`"molten"`), &st))
}

func TestSegmentJSON(t *testing.T) {
	s := newStream(t)
	seg := shard.Segment{
		ID: 464, VChannel: s.vs[1], Partition: 3, State: shard.Sealed,
		Rows: 10, Bytes: 1000, First: 5, Last: 9, FirstTT: 1 << 40, LastTT: 1<<40 + 7,
		Created: t0, LastInsert: t0.Add(1e9), Capacity: 4096, Reason: shard.ReasonIdle, FlushedAt: 12,
		InFlight: 2, StampedRows: 3, StampedBytes: 4, Holds: 5, HandedOut: true,
	}
	b, err := json.Marshal(seg)
	require.NoError(t, err)
	require.JSONEq(t, `{
		"id": 464, "vchannel": "p-0_42v1", "partition": 3, "state": "sealed",
		"rows": 10, "bytes": 1000, "first_id": 5, "last_id": 9,
		"first_tt": 1099511627776, "last_tt": 1099511627783,
		"created": "2026-03-01T12:00:00Z", "last_insert": "2026-03-01T12:00:01Z",
		"capacity": 4096, "reason": "idle", "flushed_at": 12
	}`, string(b))
	var back shard.Segment
	require.NoError(t, json.Unmarshal(b, &back))
	want := seg
	want.InFlight, want.StampedRows, want.StampedBytes, want.Holds, want.HandedOut = 0, 0, 0, 0, false
	require.Equal(t, want, back)

	list, err := json.Marshal([]shard.Segment{seg})
	require.NoError(t, err)
	var backs []shard.Segment
	require.NoError(t, json.Unmarshal(list, &backs))
	require.Equal(t, []shard.Segment{want}, backs)

	require.Error(t, json.Unmarshal([]byte(`{"id": 1, "vchannel": "nope", "state": "growing"}`), &back))
	require.Error(t, json.Unmarshal([]byte(`{"id": 1, "vchannel": "p-0_42v1", "state": "x"}`), &back))
}

func TestRestoreRefusesBadMetadata(t *testing.T) {
	s := newStream(t)
	v := s.vs[0]
	good := shard.Segment{ID: 1, VChannel: v, State: shard.Growing}
	m := newManager(t, shard.Config{})
	require.NoError(t, m.Restore([]shard.Segment{good}, 3))
	for name, segs := range map[string][]shard.Segment{
		"id":          {{ID: 0, VChannel: v, State: shard.Growing}},
		"vchannel":    {{ID: 2, State: shard.Growing}},
		"cchannel":    {{ID: 2, VChannel: s.cc, State: shard.Growing}},
		"partition":   {{ID: 2, VChannel: v, Partition: -1, State: shard.Growing}},
		"state":       {{ID: 2, VChannel: v}},
		"duplicate":   {{ID: 2, VChannel: v, State: shard.Sealed}, {ID: 2, VChannel: v, Partition: 1, State: shard.Sealed}},
		"two growing": {{ID: 2, VChannel: v, Partition: 4, State: shard.Growing}, {ID: 3, VChannel: v, Partition: 4, State: shard.Growing}},
	} {
		err := m.Restore(segs, 9)
		require.ErrorIs(t, err, shard.ErrMalformed, name)
		require.ErrorIs(t, err, streamwal.ErrInvalidArgument, name)
	}
	require.Equal(t, []shard.Segment{{ID: 1, VChannel: v, State: shard.Growing, Capacity: m.Segments()[0].Capacity}}, m.Segments(), "a refused restore changes nothing")
	require.Equal(t, 3, int(m.Applied()))
}

func TestRestoreIgnoresInMemoryFields(t *testing.T) {
	s := newStream(t)
	v := s.vs[0]
	m := newManager(t, noClock(shard.Config{}))
	require.NoError(t, m.Restore([]shard.Segment{
		{ID: 1, VChannel: v, State: shard.Sealed, Capacity: 9, Reason: shard.ReasonManual, InFlight: 3, Holds: 2, HandedOut: true},
		{ID: 2, VChannel: v, State: shard.Sealed, Capacity: 9, Reason: shard.ReasonManual, FlushedAt: 4},
		{ID: 3, VChannel: v, State: shard.Growing, Capacity: 9, StampedBytes: 5},
	}, 4))
	require.Equal(t, []shard.Flush{{VChannel: v, CollectionID: 42, Segments: []int64{1}, Reason: shard.ReasonManual}}, m.Ready(),
		"a sealed segment whose flush has not landed is handed out after a restore")
	require.Zero(t, seg(t, m, 3).StampedBytes)
	id, ok := m.Growing(v, 0)
	require.True(t, ok)
	require.Equal(t, int64(3), id)
	require.NoError(t, m.Stamp(3, 1, 1, 0, t0))
}
