package main

import (
	"bytes"
	"context"
	"encoding/json"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// benchMinOps is the --min-ops of benchLoad.
const benchMinOps = 10

// benchTimeout bounds a test's bench command: a run lasts until its
// --min-ops however slow the machine, so the bound is the most runCmd's
// minute allows rather than the 20 s of the other commands' tests.
var benchTimeout = []string{"--timeout", "50s"}

// benchLoad keeps the tests' bench runs light (one collection, so that
// the read workload preloads 2000 messages and not 8000). The tests check
// what bench guarantees however slow the machine: every run completes at
// least --min-ops operations, and so has a positive rate. They check
// nothing about how fast.
var benchLoad = append([]string{"--concurrency", "2", "--size", "64", "--collections", "1", "--min-ops", strconv.Itoa(benchMinOps)}, benchTimeout...)

// benchRow is a row of bench's table: workload, system, msgs/s, p50 ms,
// p99 ms, ratio to raw JetStream.
var benchRow = regexp.MustCompile(`(?m)^\| (\w+) +\| (streamwal|jetstream) +\| ([\d.e+-]+) +\| (\d+\.\d\d) +\| (\d+\.\d\d) +\| ([\d.]*) +\|$`)

// requireBenchRate requires a msgs/s of the table to be a positive number.
func requireBenchRate(t *testing.T, rate string, row string) {
	t.Helper()
	v, err := strconv.ParseFloat(rate, 64)
	require.NoError(t, err, row)
	require.Positive(t, v, row)
}

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
		require.GreaterOrEqual(t, r.Ops, int64(benchMinOps), line)
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
	// The columns are as wide as their widest cell (a p99 of seconds
	// widens its column).
	require.Regexp(t, `(?m)^\| WORKLOAD +\| SYSTEM +\| MSGS/S +\| P50 MS +\| P99 MS +\| VS JETSTREAM +\|$`, out.String())
	rows := benchRow.FindAllStringSubmatch(out.String(), -1)
	require.Len(t, rows, 4, out.String())
	for i, r := range rows {
		require.Equal(t, []string{"append", "broadcast"}[i/2], r[1])
		require.Equal(t, []string{"streamwal", "jetstream"}[i%2], r[2])
		requireBenchRate(t, r[3], r[0])
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

// TestBenchReadAloneHasDataToRead runs the read workload without the
// append workload before it, with one reader for one more read than the
// preload has, so that on each system it reads all of it and starts over.
// However long the reader takes to open, the run reads --min-ops.
func TestBenchReadAloneHasDataToRead(t *testing.T) {
	c := newCluster(t)
	minOps := preloadCount + 1
	out := c.mustRun(t, "", append([]string{"bench", "--workload", "read", "--duration", "200ms", "--json", "--progress=false",
		"--concurrency", "1", "--size", "64", "--collections", "1", "--min-ops", strconv.Itoa(minOps)}, benchTimeout...)...)
	rs := jsonLines[benchResult](t, out)
	require.Len(t, rs, 2, out)
	for i, r := range rs {
		require.Equal(t, "read", r.Workload)
		require.Equal(t, []string{"streamwal", "jetstream"}[i], r.System)
		require.GreaterOrEqual(t, r.Ops, int64(minOps), r.System)
		require.Positive(t, r.MsgsPerSec, r.System)
	}
}

// TestBenchProgressBarIsRaceFree runs 1 MB transactions, whose first
// operation takes long enough for a progress bar's spinner goroutine to
// tick before the first render, with the bar (which must start no
// goroutine) and without one (which must start no bar). However fast or
// slow the machine, each run lasts over the spinner's 100 ms and adds
// --min-ops operations or more to its bar.
func TestBenchProgressBarIsRaceFree(t *testing.T) {
	c := newCluster(t)
	txn := append([]string{"bench", "--workload", "txn", "--size", "1000000", "--duration", "300ms", "--concurrency", "2", "--min-ops", "4"},
		benchTimeout...)
	t.Run("silent", func(t *testing.T) {
		out := c.mustRun(t, "", append(slices.Clone(txn), "--json", "--progress=false")...)
		rs := jsonLines[benchResult](t, out)
		require.Len(t, rs, 2, out)
		for _, r := range rs {
			require.GreaterOrEqual(t, r.Ops, int64(4), r.System)
		}
	})
	t.Run("shown", func(t *testing.T) {
		var out, errOut bytes.Buffer
		root := newRootCmd(&out, &errOut)
		root.SetArgs(c.args(txn...))
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		require.NoError(t, root.ExecuteContext(ctx))
		rows := benchRow.FindAllStringSubmatch(out.String(), -1)
		require.Len(t, rows, 2, out.String())
		for _, r := range rows {
			requireBenchRate(t, r[3], r[0])
		}
		require.Contains(t, errOut.String(), "txn streamwal")
		require.Contains(t, errOut.String(), "txn jetstream")
	})
}
