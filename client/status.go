package client

import (
	"context"
	"time"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/jetstream"
	"github.com/streamwal/streamwal/messages"
	"github.com/streamwal/streamwal/services/wire"
)

// Status is the cluster as the coordinator and the streams describe it.
type Status struct {
	View     wire.View       `json:"view"`
	Channels []ChannelStatus `json:"channels"`
}

// ChannelStatus is one PChannel: its assignment and its stream's tail.
// Serving is true only while the owner confirms it serves the PChannel
// under the current term in its current session (see wire.Assignment):
// a PChannel that cannot take writes is not serving, whatever its state.
type ChannelStatus struct {
	PChannel     string             `json:"pchannel"`
	State        wire.State         `json:"state"`
	Serving      bool               `json:"serving"`
	Since        time.Time          `json:"since"`
	Node         string             `json:"node,omitempty"`
	Term         uint64             `json:"term"`
	VChannels    int                `json:"vchannels"`
	LastID       messages.MessageID `json:"last_id"`
	LastTimeTick messages.TimeTick  `json:"last_timetick"`
}

// View asks the coordinator for the assignment view.
func (c *Client) View(ctx context.Context) (wire.View, error) {
	var v wire.View
	err := c.callCoord(ctx, streamwal.CoordStatus, struct{}{}, &v)
	return v, err
}

// CheckPChannel refuses a PChannel the cluster does not have
// (streamwal.ErrInvalidArgument), so that nothing waits for an owner that
// will never come.
func (c *Client) CheckPChannel(ctx context.Context, p streamwal.PChannel) error {
	v, err := c.View(ctx)
	if err != nil {
		return err
	}
	for _, a := range v.Channels {
		if a.PChannel == p.String() {
			return nil
		}
	}
	return streamwal.Errorf(streamwal.CodeInvalidArgument, "cluster %s has no pchannel %s (it has %d)", c.opts.cluster, p, len(v.Channels))
}

// Status asks the coordinator for the assignment view and reads the tail
// of every assigned PChannel's stream.
func (c *Client) Status(ctx context.Context) (Status, error) {
	var st Status
	var err error
	if st.View, err = c.View(ctx); err != nil {
		return st, err
	}
	for _, a := range st.View.Channels {
		ch := ChannelStatus{PChannel: a.PChannel, State: a.State, Serving: a.Serving, Since: a.Since, Node: a.Node, Term: a.Term, VChannels: a.VChannels}
		if a.Term > 0 {
			if p, err := streamwal.ParsePChannel(a.PChannel); err == nil {
				ch.LastID, ch.LastTimeTick = c.tail(ctx, p)
			}
		}
		st.Channels = append(st.Channels, ch)
	}
	return st, nil
}

// tail reads the last message of p's stream (zeros if none).
func (c *Client) tail(ctx context.Context, p streamwal.PChannel) (messages.MessageID, messages.TimeTick) {
	s, err := c.backend.Read(ctx, p, jetstream.ReadOptions{Start: jetstream.Latest()})
	if err != nil {
		return 0, 0
	}
	last := s.Start().ID
	_ = s.Close()
	if last == 0 {
		return 0, 0
	}
	m, err := c.backend.Get(ctx, p, last)
	if err != nil {
		return last, 0
	}
	return last, m.TimeTick()
}
