// Command streamwal runs and inspects a streamwal cluster.
//
//	streamwal serve    run an embedded NATS server with JetStream (and, as
//	                   later capabilities land, the coordinator and a node)
//
// Run `streamwal help` for the flags of each command.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	root := newRootCmd(os.Stdout, os.Stderr)
	if err := root.ExecuteContext(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "streamwal:", err)
		os.Exit(1)
	}
}
