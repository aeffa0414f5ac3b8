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
