// Command streamwal runs and inspects a streamwal cluster.
//
//	streamwal serve                    an embedded NATS server with a coordinator and a node
//	streamwal serve --server URL       the same coordinator and node on existing NATS servers
//	streamwal coord                    one coordinator on existing NATS servers (run two or three)
//	streamwal node                     one node on existing NATS servers (--id or --state-dir)
//	streamwal status                   the coordinator, the nodes and every PChannel
//	streamwal collection create|drop   a collection's lifecycle (broadcasts)
//	streamwal collection flush         seal a collection's growing segments (ManualFlush)
//	streamwal append                   append to a VChannel (arguments or standard input)
//	streamwal tail                     follow a VChannel or PChannel in TimeTick order
//	streamwal segments                 a VChannel's segments: growing, sealed, flushed
//	streamwal pchannel accept-loss     consent to serve a PChannel that lost history
//	streamwal bench                    workloads against raw JetStream on the same server
//
// Every command that talks to NATS takes --server (one or more URLs,
// comma-separated), one of --creds, --nkey or --user/--password, and
// --tls-ca, --tls-cert/--tls-key; a flag not given comes from its STREAMWAL_*
// environment variable (STREAMWAL_SERVER, then NATS_URL, for --server), and
// a flag given wins. Run `streamwal help <command>` for the flags of each
// command.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	root := newRootCmd(os.Stdout, os.Stderr)
	if err := root.ExecuteContext(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "streamwal:", oneLine(err))
		os.Exit(1)
	}
}

// oneLine is err's message on one line: cobra's suggestions for a
// mistyped command ("\n\nDid you mean this?\n\tnode\n") become
// "; did you mean: node".
func oneLine(err error) string {
	msg, suggestions, found := strings.Cut(err.Error(), "\n\nDid you mean this?\n")
	if !found {
		return msg
	}
	return msg + "; did you mean: " + strings.Join(strings.Fields(suggestions), ", ")
}
