package client

import (
	"context"
	"strconv"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/messages"
	"github.com/streamwal/streamwal/services/read"
)

// ReadOptions say what to read.
type ReadOptions struct {
	// VChannel is read with the PChannel-level messages of its PChannel;
	// when zero, PChannel is read whole.
	VChannel streamwal.VChannel
	PChannel streamwal.PChannel
	// Start is where to start (read.Earliest(), read.Latest(),
	// read.From(id), read.After(id), read.AtTimeTick(t)).
	Start read.Start
	// Types are the types to deliver (see read.Filter).
	Types []*messages.Type
	// MinTimeTick drops messages with a smaller TimeTick.
	MinTimeTick messages.TimeTick
}

// Read opens a scanner straight on JetStream: messages in TimeTick order
// with transactions assembled, a visibility watermark, and All for a Go
// iterator. Close it when done.
func (c *Client) Read(ctx context.Context, o ReadOptions) (*read.Scanner, error) {
	p := o.PChannel
	if !o.VChannel.IsZero() {
		p = o.VChannel.PChannel()
	}
	return read.Open(ctx, read.Options{Backend: c.backend, Codec: c.codec, Ticks: c.nc, PChannel: p,
		VChannel: o.VChannel, Start: o.Start, Types: o.Types, MinTimeTick: o.MinTimeTick})
}

// itoa formats an int64.
func itoa(n int64) string { return strconv.FormatInt(n, 10) }
