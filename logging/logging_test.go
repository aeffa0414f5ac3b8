package logging_test

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
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

func TestParseFormat(t *testing.T) {
	for _, s := range []string{"text", "json", "auto"} {
		f, err := logging.ParseFormat(s)
		require.NoError(t, err)
		require.Equal(t, s, f.String())
	}
	for _, s := range []string{"", "JSON ", "xml", "console"} {
		_, err := logging.ParseFormat(s)
		require.ErrorContains(t, err, "want text, json or auto", s)
	}
	f := logging.FormatAuto
	require.NoError(t, f.Set("json"))
	require.Equal(t, logging.FormatJSON, f)
	require.Error(t, f.Set("yaml"))
	require.Equal(t, logging.FormatJSON, f, "a refused value changes nothing")
}

// A log written to a file (not a terminal): JSON lines by default, plain
// text without escape codes when asked for text.
func TestFormatOfALogInAFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "log")
	file, err := os.Create(path)
	require.NoError(t, err)
	defer file.Close()
	require.Equal(t, logging.FormatJSON, logging.FormatAuto.Resolve(file))
	require.Equal(t, logging.FormatJSON, logging.FormatAuto.Resolve(&bytes.Buffer{}))
	require.Equal(t, logging.FormatText, logging.FormatText.Resolve(file))

	asJSON := logging.NewFormat(file, zerolog.InfoLevel, logging.FormatAuto)
	asJSON.Warn().Str("pchannel", "pchan-1").Msg("as json")
	asText := logging.NewFormat(file, zerolog.InfoLevel, logging.FormatText)
	asText.Warn().Str("pchannel", "pchan-1").Msg("as text")
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	require.Len(t, lines, 2, string(data))
	var rec map[string]any
	require.NoError(t, json.Unmarshal([]byte(lines[0]), &rec), lines[0])
	require.Equal(t, "as json", rec["message"])
	require.Equal(t, "warn", rec["level"])
	require.Equal(t, "pchan-1", rec["pchannel"])
	require.NotContains(t, lines[1], "\x1b[", "escape codes in a file")
	require.Regexp(t, `^\d\d:\d\d:\d\d WRN as text pchannel=pchan-1$`, lines[1])
}
