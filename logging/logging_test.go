package logging_test

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/streamwal/streamwal/logging"
)

func TestComponentField(t *testing.T) {
	var buf bytes.Buffer
	l := logging.Component(logging.New(&buf, zerolog.InfoLevel, false), "sequencer")
	l.Info().Str("pchannel", "pchan-0").Msg("opened")
	l.Debug().Msg("hidden below info")
	var rec map[string]any
	require.NoError(t, json.Unmarshal(bytes.TrimSpace(buf.Bytes()), &rec))
	require.Equal(t, "sequencer", rec[logging.FieldComponent])
	require.Equal(t, "opened", rec["message"])
	require.Equal(t, "pchan-0", rec["pchannel"])
}

func TestParseLevel(t *testing.T) {
	lvl, err := logging.ParseLevel("warn")
	require.NoError(t, err)
	require.Equal(t, zerolog.WarnLevel, lvl)
	_, err = logging.ParseLevel("loud")
	require.Error(t, err)
}
