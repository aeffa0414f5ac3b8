package client

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"time"

	njs "github.com/nats-io/nats.go/jetstream"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/messages"
)

// SubscriptionInfo describes a durable subscription (or group) and its
// positions.
type SubscriptionInfo struct {
	Name string `json:"name"`
	// VChannel or Collection is what it subscribes to.
	VChannel   string `json:"vchannel,omitempty"`
	Collection int64  `json:"collection,omitempty"`
	// Group reports a group: its members share the VChannels.
	Group   bool      `json:"group"`
	Created time.Time `json:"created"`
	// Positions are its acknowledged positions, one per VChannel it has
	// read, sorted by VChannel.
	Positions []PositionInfo `json:"positions"`
}

// PositionInfo is a Position with how far behind the log it is.
type PositionInfo struct {
	Position
	// LastID and LastTimeTick are those of the last message of the
	// VChannel's PChannel stream (0 when unknown).
	LastID       messages.MessageID `json:"last_id"`
	LastTimeTick messages.TimeTick  `json:"last_timetick"`
	// Lag is the time between the last acknowledged message and the last
	// message of the PChannel (by their TimeTicks; 0 when unknown or
	// caught up).
	Lag time.Duration `json:"lag"`
	// Expired reports that the position stopped holding the log: nothing
	// was acknowledged for longer than its expiry.
	Expired bool `json:"expired"`
	// Holder is the group member that holds the VChannel's lease ("" when
	// none, or not a group).
	Holder string `json:"holder,omitempty"`
}

// Subscriptions lists the durable subscriptions and groups of the
// cluster with their positions, sorted by name.
func (c *Client) Subscriptions(ctx context.Context) ([]SubscriptionInfo, error) {
	kv, err := c.subscriptionsKV(ctx)
	if err != nil {
		return nil, err
	}
	keys, err := subscriptionKeys(ctx, kv)
	if err != nil {
		return nil, err
	}
	byName := map[string]*SubscriptionInfo{}
	positions := map[string][]Position{}
	leases := map[string]string{}
	for _, key := range keys {
		e, err := kv.Get(ctx, key)
		if errors.Is(err, njs.ErrKeyNotFound) {
			continue // deleted meanwhile
		}
		if err != nil {
			return nil, streamwal.Errorf(streamwal.CodeUnavailable, "read %s: %v", key, err)
		}
		switch {
		case strings.HasPrefix(key, streamwal.SubscriptionPrefix):
			var rec subscriptionRecord
			if json.Unmarshal(e.Value(), &rec) == nil {
				byName[rec.Name] = &SubscriptionInfo{Name: rec.Name, VChannel: rec.VChannel, Collection: rec.Collection,
					Group: rec.Group, Created: rec.Created}
			}
		case strings.HasPrefix(key, streamwal.SubscriptionPositionPrefix):
			var pos Position
			if json.Unmarshal(e.Value(), &pos) == nil {
				name := strings.TrimSuffix(strings.TrimPrefix(key, streamwal.SubscriptionPositionPrefix), "."+pos.VChannel)
				positions[name] = append(positions[name], pos)
			}
		case strings.HasPrefix(key, streamwal.SubscriptionLeasePrefix):
			var l lease
			if json.Unmarshal(e.Value(), &l) == nil && time.Now().Before(l.Expires) {
				leases[strings.TrimPrefix(key, streamwal.SubscriptionLeasePrefix)] = l.Member
			}
		}
	}
	out := make([]SubscriptionInfo, 0, len(byName))
	for name, info := range byName {
		for _, pos := range positions[name] {
			pi := c.positionInfo(ctx, pos)
			pi.Holder = leases[name+"."+pos.VChannel]
			info.Positions = append(info.Positions, pi)
		}
		slices.SortFunc(info.Positions, func(a, b PositionInfo) int { return strings.Compare(a.VChannel, b.VChannel) })
		out = append(out, *info)
	}
	slices.SortFunc(out, func(a, b SubscriptionInfo) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// subscriptionKeys lists the keys of the subscriptions bucket.
func subscriptionKeys(ctx context.Context, kv njs.KeyValue) ([]string, error) {
	lister, err := kv.ListKeys(ctx)
	if err != nil {
		return nil, streamwal.Errorf(streamwal.CodeUnavailable, "list subscriptions: %v", err)
	}
	var keys []string
	for k := range lister.Keys() {
		keys = append(keys, k)
	}
	return keys, nil
}

// positionInfo adds the PChannel's tail to pos.
func (c *Client) positionInfo(ctx context.Context, pos Position) PositionInfo {
	pi := PositionInfo{Position: pos, Expired: pos.Expired(time.Now())}
	v, err := streamwal.ParseVChannel(pos.VChannel)
	if err != nil {
		return pi
	}
	tctx, cancel := context.WithTimeout(ctx, c.opts.timeout)
	defer cancel()
	pi.LastID, pi.LastTimeTick = c.tail(tctx, v.PChannel())
	if pi.LastTimeTick > pos.TimeTick && pos.TimeTick > 0 {
		pi.Lag = pi.LastTimeTick.Physical().Sub(pos.TimeTick.Physical())
	}
	return pi
}

// DeleteSubscription deletes the durable subscription (or group) name:
// its record, its positions and its leases. Its positions stop holding
// the log. Deleting one that does not exist is
// streamwal.ErrSubscriptionNotFound.
func (c *Client) DeleteSubscription(ctx context.Context, name string) error {
	if err := streamwal.CheckSubscriptionName(name); err != nil {
		return err
	}
	kv, err := c.subscriptionsKV(ctx)
	if err != nil {
		return err
	}
	if _, err := readSubscription(ctx, kv, name); err != nil {
		return err
	}
	keys, err := subscriptionKeys(ctx, kv)
	if err != nil {
		return err
	}
	for _, key := range keys {
		if !ownedBy(key, name) {
			continue
		}
		if err := kv.Purge(ctx, key); err != nil && !errors.Is(err, njs.ErrKeyNotFound) {
			return streamwal.Errorf(streamwal.CodeUnavailable, "delete %s: %v", key, err)
		}
	}
	return nil
}

// ownedBy reports whether key belongs to subscription name.
func ownedBy(key, name string) bool {
	if key == streamwal.SubscriptionKey(name) {
		return true
	}
	for _, prefix := range []string{streamwal.SubscriptionPositionPrefix, streamwal.SubscriptionLeasePrefix} {
		if strings.HasPrefix(key, prefix+name+".") {
			return true
		}
	}
	return false
}
