package main

import (
	"fmt"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/spf13/pflag"

	"github.com/streamwal/streamwal"
)

// replicateAuth are the credentials a secondary's replicators log in to
// their source with, by source cluster: --replicate-nkey and
// --replicate-creds, each NAME=FILE, repeated for each source.
type replicateAuth struct {
	nkeys, creds []string
}

// add registers the flags.
func (a *replicateAuth) add(fl *pflag.FlagSet) {
	fl.StringArrayVar(&a.nkeys, "replicate-nkey", nil, "NAME=FILE: on a secondary, the replicators log in to the source cluster NAME\n"+
		"with the nkey seed in FILE (a client role of NAME, as `streamwal auth init` writes: client.nk); repeat for each source")
	fl.StringArrayVar(&a.creds, "replicate-creds", nil, "NAME=FILE: as --replicate-nkey, with a NATS credentials file (JWT and seed)")
}

// options parses the flags into the options of the connection to each
// source (nil when none are given).
func (a *replicateAuth) options() (func(streamwal.Cluster) []nats.Option, error) {
	by := map[streamwal.Cluster][]nats.Option{}
	for _, set := range []struct {
		flag  string
		vals  []string
		login func(file string) (nats.Option, error)
	}{
		{"--replicate-nkey", a.nkeys, func(file string) (nats.Option, error) { return nats.NkeyOptionFromSeed(file) }},
		{"--replicate-creds", a.creds, func(file string) (nats.Option, error) { return nats.UserCredentials(file), nil }},
	} {
		for _, v := range set.vals {
			name, file, ok := strings.Cut(v, "=")
			if !ok || file == "" {
				return nil, fmt.Errorf("%s %q: want NAME=FILE", set.flag, v)
			}
			c, err := streamwal.ParseCluster(name)
			if err != nil {
				return nil, fmt.Errorf("%s %q: %w", set.flag, v, err)
			}
			if by[c] != nil {
				return nil, fmt.Errorf("%s %q: cluster %s has credentials already", set.flag, v, c)
			}
			o, err := set.login(file)
			if err != nil {
				return nil, fmt.Errorf("%s %q: %w", set.flag, v, err)
			}
			by[c] = []nats.Option{o}
		}
	}
	if len(by) == 0 {
		return nil, nil
	}
	return func(c streamwal.Cluster) []nats.Option { return by[c] }, nil
}
