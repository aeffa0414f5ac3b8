package coord

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/streamwal/streamwal"
)

// TestRequestsAreLoggedByOutcome: a failed request is a warning, a
// refused one a debug line, a success nothing.
func TestRequestsAreLoggedByOutcome(t *testing.T) {
	var buf bytes.Buffer
	tm := &tenure{log: zerolog.New(&buf).Level(zerolog.DebugLevel)}
	tm.logRequest(streamwal.CoordAllocate, nil)
	tm.logRequest(streamwal.CoordAllocate, streamwal.Errorf(streamwal.CodeInvalidArgument, "no shards"))
	tm.logRequest(streamwal.CoordBroadcast, streamwal.Errorf(streamwal.CodeUnavailable, "node gone"))
	var lines []map[string]any
	for _, l := range bytes.Split(bytes.TrimSpace(buf.Bytes()), []byte("\n")) {
		var rec map[string]any
		require.NoError(t, json.Unmarshal(l, &rec))
		lines = append(lines, rec)
	}
	require.Len(t, lines, 2)
	require.Equal(t, "debug", lines[0]["level"])
	require.Equal(t, "request refused", lines[0]["message"])
	require.Equal(t, string(streamwal.CodeInvalidArgument), lines[0]["code"])
	require.Equal(t, "warn", lines[1]["level"])
	require.Equal(t, "request failed", lines[1]["message"])
	require.Equal(t, string(streamwal.CoordBroadcast), lines[1]["op"])
}
