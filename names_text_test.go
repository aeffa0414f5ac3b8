package streamwal_test

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/streamwal/streamwal"
)

// named is a request carrying every name that crosses the wire.
type named struct {
	P  streamwal.PChannel   `json:"p,omitzero"`
	V  streamwal.VChannel   `json:"v,omitzero"`
	VS []streamwal.VChannel `json:"vs,omitempty"`
	N  streamwal.NodeID     `json:"n,omitempty"`
}

// TestNamesJSONRoundTrip: names travel as their strings and come back
// equal.
func TestNamesJSONRoundTrip(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		p := drawPChannel(t, "p")
		v := drawVChannel(t, p, "v")
		n, err := streamwal.ParseNodeID(genNodeID.Draw(t, "n"))
		require.NoError(t, err)
		in := named{P: p, V: v, VS: []streamwal.VChannel{v, p.CChannel()}, N: n}
		data, err := json.Marshal(in)
		require.NoError(t, err)
		var raw map[string]any
		require.NoError(t, json.Unmarshal(data, &raw))
		require.Equal(t, p.String(), raw["p"])
		require.Equal(t, v.String(), raw["v"])
		require.Equal(t, string(n), raw["n"])
		var out named
		require.NoError(t, json.Unmarshal(data, &out))
		require.Equal(t, in, out)
	})
}

// TestNamesJSONZero: the zero values are left out (omitzero) or travel
// as "", and "" decodes to them.
func TestNamesJSONZero(t *testing.T) {
	data, err := json.Marshal(named{})
	require.NoError(t, err)
	require.JSONEq(t, `{}`, string(data))
	var out named
	require.NoError(t, json.Unmarshal([]byte(`{"p":"","v":"","n":""}`), &out))
	require.Equal(t, named{}, out)
}

// TestNamesJSONInvalid: a bad name fails the decoding with
// ErrInvalidArgument, whichever field carries it.
func TestNamesJSONInvalid(t *testing.T) {
	for _, doc := range []string{
		`{"p":"nope_0"}`, `{"p":"p-01"}`, `{"p":"-1"}`,
		`{"v":"p-0"}`, `{"v":"p-0_1v9999"}`, `{"vs":["p-0_1v0","p-0_x"]}`,
		`{"n":"-n"}`, `{"n":"a.b"}`,
	} {
		var out named
		err := json.Unmarshal([]byte(doc), &out)
		require.ErrorIs(t, err, streamwal.ErrInvalidArgument, doc)
	}
}
