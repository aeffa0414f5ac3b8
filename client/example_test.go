package client_test

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/streamwal/streamwal/client"
	"github.com/streamwal/streamwal/embedded"
	"github.com/streamwal/streamwal/embedded/system"
	"github.com/streamwal/streamwal/messages"
)

// Example runs a whole cluster in process, then creates a collection,
// appends to it, runs a transaction and reads everything back in TimeTick
// order.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dir, _ := os.MkdirTemp("", "streamwal-example")
	defer os.RemoveAll(dir)

	// An embedded NATS server with a coordinator and a node.
	sys, err := system.Start(ctx, system.Options{ServerOptions: embedded.Options{StoreDir: dir}})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer sys.Close()
	if _, err := sys.WaitServing(ctx, false); err != nil {
		fmt.Println(err)
		return
	}

	// Connect as any service would: through NATS (client.WithLocal(sys.Local())
	// would call the node of this process directly).
	c, err := client.Connect(sys.Server.ClientURL())
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()

	// Create a collection: its VChannel is allocated and the
	// CreateCollection broadcast lands on it and on the CChannel.
	vs, err := c.CreateCollection(ctx, client.Collection{DBName: "shop", Name: "orders", ID: 1})
	if err != nil {
		fmt.Println(err)
		return
	}
	v := vs[0]

	// Append, then run a transaction of two inserts.
	insert := func(payload string) *messages.MutableMessage {
		m, _ := c.Codec().New(messages.TypeInsert, v, []byte(payload))
		return m
	}
	if _, err := c.Append(ctx, insert("order 1")); err != nil {
		fmt.Println(err)
		return
	}
	txn, err := c.BeginTxn(ctx, v, 0)
	if err != nil {
		fmt.Println(err)
		return
	}
	if _, err := txn.Append(ctx, insert("order 2"), insert("order 3")); err != nil {
		fmt.Println(err)
		return
	}
	commit, err := txn.Commit(ctx)
	if err != nil {
		fmt.Println(err)
		return
	}

	// Read the VChannel from the start up to the commit.
	s, err := c.Read(ctx, client.ReadOptions{VChannel: v, Start: client.Earliest()})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer s.Close()
	for m, err := range s.All(ctx) {
		if err != nil {
			fmt.Println(err)
			return
		}
		switch m.Type() {
		case messages.TypeTxn:
			fmt.Printf("Txn of %d messages:", len(m.TxnBody()))
			for _, b := range m.TxnBody() {
				fmt.Printf(" %q", b.Payload())
			}
			fmt.Println()
		case messages.TypeInsert:
			fmt.Printf("Insert %q\n", m.Payload())
		default:
			// DDL, and the WAL's own messages: the CreateSegment that
			// opened the segment the first insert went to.
			fmt.Println(m.Type())
		}
		if m.ID() == commit.ID {
			break
		}
	}
	// Output:
	// CreateCollection
	// CreateSegment
	// Insert "order 1"
	// Txn of 2 messages: "order 2" "order 3"
}

// startExample starts a whole cluster in process and connects a client to
// it; stop ends both.
func startExample(ctx context.Context) (c *client.Client, stop func(), err error) {
	dir, err := os.MkdirTemp("", "streamwal-example")
	if err != nil {
		return nil, nil, err
	}
	sys, err := system.Start(ctx, system.Options{ServerOptions: embedded.Options{StoreDir: dir}})
	if err != nil {
		os.RemoveAll(dir)
		return nil, nil, err
	}
	halt := func() {
		sys.Close()
		os.RemoveAll(dir)
	}
	if _, err := sys.WaitServing(ctx, false); err != nil {
		halt()
		return nil, nil, err
	}
	if c, err = client.Connect(sys.Server.ClientURL()); err != nil {
		halt()
		return nil, nil, err
	}
	return c, func() { c.Close(); halt() }, nil
}

// ExampleClient_AppendBytes appends raw payloads to a collection's
// VChannel and reads everything there is, then returns (UntilNow).
func ExampleClient_AppendBytes() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, stop, err := startExample(ctx)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer stop()
	vs, err := c.CreateCollection(ctx, client.Collection{DBName: "shop", Name: "orders", ID: 1})
	if err != nil {
		fmt.Println(err)
		return
	}
	if _, err := c.AppendBytes(ctx, vs[0], []byte("order 1"), []byte("order 2")); err != nil {
		fmt.Println(err)
		return
	}
	s, err := c.Read(ctx, client.ReadOptions{VChannel: vs[0], Types: []*messages.Type{messages.TypeInsert}, UntilNow: true})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer s.Close()
	for m, err := range s.All(ctx) {
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Printf("%s\n", m.Payload())
	}
	fmt.Println("read to now")
	// Output:
	// order 1
	// order 2
	// read to now
}

// ExampleClient_Subscribe keeps a durable subscription's position in the
// cluster: after a restart (here: Close, then Subscribe again) it resumes
// after the last acknowledged message.
func ExampleClient_Subscribe() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, stop, err := startExample(ctx)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer stop()
	vs, err := c.CreateCollection(ctx, client.Collection{DBName: "shop", Name: "orders", ID: 1})
	if err != nil {
		fmt.Println(err)
		return
	}
	if _, err := c.AppendBytes(ctx, vs[0], []byte("order 1"), []byte("order 2"), []byte("order 3")); err != nil {
		fmt.Println(err)
		return
	}
	consume := func(n int, ack bool) {
		sub, err := c.Subscribe(ctx, "billing", client.SubscribeVChannel(vs[0]), client.SubscribeTypes(messages.TypeInsert))
		if err != nil {
			fmt.Println(err)
			return
		}
		defer sub.Close()
		for range n {
			d, err := sub.Next(ctx)
			if err != nil {
				fmt.Println(err)
				return
			}
			fmt.Printf("%s\n", d.Message.Payload())
			if ack {
				// Acknowledges this message and every one before it.
				if err := d.Ack(ctx); err != nil {
					fmt.Println(err)
					return
				}
			}
		}
	}
	consume(1, true)  // order 1, acknowledged
	consume(1, false) // order 2, not acknowledged: delivered again
	consume(2, true)
	// Output:
	// order 1
	// order 2
	// order 2
	// order 3
}

// ExampleSubscribeGroup runs two members of a group on a collection of
// two shards: each VChannel is read by one member at a time.
func ExampleSubscribeGroup() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, stop, err := startExample(ctx)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer stop()
	col := client.Collection{DBName: "shop", Name: "orders", ID: 1, Shards: 2}
	vs, err := c.CreateCollection(ctx, col)
	if err != nil {
		fmt.Println(err)
		return
	}
	for i, v := range vs {
		if _, err := c.AppendBytes(ctx, v, fmt.Appendf(nil, "order of shard %d", i)); err != nil {
			fmt.Println(err)
			return
		}
	}
	var members []*client.Subscription
	for _, name := range []string{"worker-1", "worker-2"} {
		sub, err := c.Subscribe(ctx, "billing", client.SubscribeCollection(col.ID), client.SubscribeGroup(name),
			client.SubscribeTypes(messages.TypeInsert))
		if err != nil {
			fmt.Println(err)
			return
		}
		defer sub.Close()
		members = append(members, sub)
	}
	// Wait until the second member has its share: one VChannel each.
	for {
		subs, err := c.Subscriptions(ctx)
		if err != nil {
			fmt.Println(err)
			return
		}
		holders := map[string]bool{}
		for _, p := range subs[0].Positions {
			holders[p.Holder] = true
		}
		if len(holders) == 2 && !holders[""] {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	for _, sub := range members {
		d, err := sub.Next(ctx)
		if err != nil {
			fmt.Println(err)
			return
		}
		if err := d.Ack(ctx); err != nil {
			fmt.Println(err)
			return
		}
	}
	subs, _ := c.Subscriptions(ctx)
	for _, p := range subs[0].Positions {
		fmt.Println("acknowledged on one VChannel by one member:", p.ID > 0 && p.Holder != "")
	}
	// Output:
	// acknowledged on one VChannel by one member: true
	// acknowledged on one VChannel by one member: true
}
