package client

import "time"

// lease is the stored value of streamwal.SubscriptionLeaseKey: the group
// member that reads a VChannel, until Expires unless it renews it.
type lease struct {
	Member  string    `json:"member"`
	Expires time.Time `json:"expires"`
}
