package main

import (
	"encoding/json"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
)

// tailIDs runs `streamwal tail --json` with args and returns the IDs it
// printed.
func tailIDs(t *testing.T, url string, args ...string) []uint64 {
	t.Helper()
	out := mustRunBinary(t, "", append([]string{"tail", "--server", url, "--json", "--timeout", "30s"}, args...)...)
	var ids []uint64
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var l tailLine
		require.NoError(t, json.Unmarshal([]byte(line), &l), line)
		ids = append(ids, uint64(l.ID))
	}
	return ids
}

// TestDurableTailAcrossRestart: `tail --durable NAME` resumes after the
// last message it printed, across calls and across a restart of serve;
// `subscriptions` lists it at that message.
func TestDurableTailAcrossRestart(t *testing.T) {
	dir := t.TempDir()
	p, url := serveAndWait(t, dir)
	v := createCollection(t, url, 1801)[0]
	mustRunBinary(t, "", "append", "--server", url, "--vchannel", v, "--timeout", "20s", "a", "b", "c")

	durable := []string{"--vchannel", v, "--durable", "cli", "--from-start", "--limit", "2"}
	got := append(tailIDs(t, url, durable...), tailIDs(t, url, durable...)...)
	require.Equal(t, tailIDs(t, url, "--vchannel", v, "--from-start", "--limit", "4"), got,
		"two durable calls print what one plain read from the start does")

	p.stop(syscall.SIGTERM)
	_, url = serveAndWait(t, dir)
	mustRunBinary(t, "", "append", "--server", url, "--vchannel", v, "--timeout", "20s", "d", "e")
	got = append(got, tailIDs(t, url, durable...)...)
	require.Equal(t, tailIDs(t, url, "--vchannel", v, "--from-start", "--limit", "6"), got,
		"after the restart, the durable tail resumes after the last message it printed")

	out := mustRunBinary(t, "", "subscriptions", "--server", url, "--json")
	var sub struct {
		Name      string `json:"name"`
		VChannel  string `json:"vchannel"`
		Positions []struct {
			ID uint64 `json:"id"`
		} `json:"positions"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &sub), out)
	require.Equal(t, "cli", sub.Name)
	require.Equal(t, v, sub.VChannel)
	require.Len(t, sub.Positions, 1)
	require.Equal(t, got[len(got)-1], sub.Positions[0].ID)
	require.Contains(t, mustRunBinary(t, "", "subscriptions", "--server", url), "holds the log")

	mustRunBinary(t, "", "subscriptions", "delete", "cli", "--server", url)
	require.Contains(t, mustRunBinary(t, "", "subscriptions", "--server", url), "no durable subscriptions")
	_, err := runBinary(t, "", "tail", "--server", url, "--pchannel", "pchan-0", "--durable", "x", "--timeout", "20s")
	require.ErrorContains(t, err, "--durable follows one --vchannel")
}
