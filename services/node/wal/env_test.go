package wal_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/embedded"
	"github.com/streamwal/streamwal/internal/testbed"
	"github.com/streamwal/streamwal/jetstream"
	"github.com/streamwal/streamwal/messages"
	"github.com/streamwal/streamwal/services/node/timetick"
	"github.com/streamwal/streamwal/services/node/wal"
	"github.com/streamwal/streamwal/services/read"
)

// TestMain checks for leaked goroutines (see embedded.VerifyNoLeaks).
func TestMain(m *testing.M) { embedded.VerifyNoLeaks(m) }

// env is one embedded server with a backend, a codec and an oracle shared
// by every WAL a test opens.
type env struct {
	t       *testing.T
	nc      *nats.Conn
	backend jetstream.Backend
	codec   *messages.Codec
	oracle  timetick.Oracle
	p       streamwal.PChannel
}

// newEnv starts a server for t.
func newEnv(t *testing.T) *env {
	t.Helper()
	b := testbed.Start(t, testbed.Config{})
	p, err := streamwal.NewPChannel("p", 0)
	require.NoError(t, err)
	return &env{t: t, nc: b.Conn, backend: b.Backend, codec: b.Codec, oracle: timetick.NewLocalOracle(nil), p: p}
}

// config is the WAL configuration of term, with a sync interval long
// enough that tests drive Sync themselves.
func (e *env) config(term uint64) wal.Config {
	return wal.Config{Backend: e.backend, Codec: e.codec, PChannel: e.p, Term: term, Node: "n1",
		Oracle: e.oracle, SyncInterval: time.Hour, Ticks: e.nc}
}

// open opens the WAL under term and closes it at the end of the test.
func (e *env) open(term uint64) *wal.WAL {
	e.t.Helper()
	w, err := wal.Open(context.Background(), e.config(term))
	require.NoError(e.t, err)
	e.t.Cleanup(func() { _ = w.Close() })
	return w
}

// vchannel returns the VChannel of collection id, shard 0.
func (e *env) vchannel(id int64) streamwal.VChannel {
	v, err := e.p.VChannel(id, 0)
	require.NoError(e.t, err)
	return v
}

// createCollection appends v's CreateCollection with partitions.
func (e *env) createCollection(w *wal.WAL, v streamwal.VChannel, partitions ...int64) *messages.ImmutableMessage {
	e.t.Helper()
	m, err := e.codec.NewBody(messages.TypeCreateCollection, v, messages.CreateCollectionBody{
		CollectionRef: messages.CollectionRef{DBName: "db", CollectionName: v.String(), CollectionID: v.CollectionID()},
		PartitionIDs:  partitions, VChannels: []string{v.String()},
	})
	require.NoError(e.t, err)
	im, err := w.Append(context.Background(), m)
	require.NoError(e.t, err)
	return im
}

// insert builds an Insert on v.
func (e *env) insert(v streamwal.VChannel, payload string, opts ...messages.Option) *messages.MutableMessage {
	e.t.Helper()
	m, err := e.codec.New(messages.TypeInsert, v, []byte(payload), opts...)
	require.NoError(e.t, err)
	return m
}

// scan opens a read pipeline scanner on v (the whole PChannel when zero).
func (e *env) scan(v streamwal.VChannel, start read.Start, types ...*messages.Type) *read.Scanner {
	e.t.Helper()
	s, err := read.Open(context.Background(), read.Options{Backend: e.backend, Codec: e.codec, Ticks: e.nc,
		PChannel: e.p, VChannel: v, Start: start, Types: types})
	require.NoError(e.t, err)
	e.t.Cleanup(func() { _ = s.Close() })
	return s
}

// readUntil reads s until it delivers a message at or past id.
func (e *env) readUntil(s *read.Scanner, id messages.MessageID) []*messages.ImmutableMessage {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out []*messages.ImmutableMessage
	for {
		m, err := s.Next(ctx)
		require.NoError(e.t, err, "read until %d, got %d messages", id, len(out))
		out = append(out, m)
		if m.ID() >= id {
			return out
		}
	}
}
