// Command streamwal runs and inspects a streamwal cluster.
//
//	streamwal serve                    an embedded NATS server with a coordinator and a node
//	streamwal status                   the coordinator, the nodes and every PChannel
//	streamwal collection create|drop   a collection's lifecycle (broadcasts)
//	streamwal collection flush         seal a collection's growing segments (ManualFlush)
//	streamwal append                   append to a VChannel (arguments or standard input)
//	streamwal tail                     follow a VChannel or PChannel in TimeTick order
//	streamwal segments                 a VChannel's segments: growing, sealed, flushed
//	streamwal pchannel accept-loss     consent to serve a PChannel that lost history
//	streamwal bench                    workloads against raw JetStream on the same server
//
// Run `streamwal help <command>` for the flags of each command.
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
