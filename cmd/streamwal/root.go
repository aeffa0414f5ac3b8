package main

import (
	"io"

	"github.com/spf13/cobra"
)

// newRootCmd builds the command tree writing to out and errOut, so tests can
// run every subcommand in-process.
func newRootCmd(out, errOut io.Writer) *cobra.Command {
	root := &cobra.Command{
		Use:           "streamwal",
		Short:         "A distributed write-ahead log on NATS JetStream",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetOut(out)
	root.SetErr(errOut)
	root.AddCommand(newServeCmd(), newStatusCmd(), newCollectionCmd(), newAppendCmd(), newTailCmd(), newBenchCmd(),
		newSegmentsCmd(), newPChannelCmd())
	return root
}
