package main

import (
	"fmt"
	"io"

	"github.com/spf13/pflag"

	"github.com/dyadfs/dyadfs/hfl"
)

const keyUsage = `Usage: dyadfs key [--key-depth D] [--key-bins B] RELPATH...

Prints, one per line, the metadata key of each path relative to the managed
directory: the key DYAD's gen_path_key computes for the same path, depth and
bins. A record lives in the Flux KVS under that key in the namespace's
directory (in etcd, in its directory's index,
/dyadfs/dir/<namespace>/<dir>//<name>). DYAD_KEY_DEPTH and DYAD_KEY_BINS set the
defaults, as for mount.

Flags:
`

func runKey(args []string, stdout io.Writer) error {
	c, err := defaultMountConfig()
	if err != nil {
		return fail(exitUsage, err.Error())
	}
	flags := pflag.NewFlagSet("key", pflag.ContinueOnError)
	flags.IntVar(&c.Locator.KeyDepth, "key-depth", c.Locator.KeyDepth, "levels of the hashed key (DYAD_KEY_DEPTH)")
	flags.IntVar(&c.Locator.KeyBins, "key-bins", c.Locator.KeyBins, "bins per level (DYAD_KEY_BINS)")
	if err := parseOperands(flags, args, keyUsage, "RELPATH", stdout); err != nil {
		return err
	}
	if err := hfl.ValidateKeyShape(c.Locator.KeyDepth, c.Locator.KeyBins); err != nil {
		return fail(exitUsage, err.Error())
	}
	for _, p := range flags.Args() {
		rel, err := hfl.CleanPath(p)
		if err != nil {
			return fail(exitUsage, fmt.Sprintf("%v: want a path relative to the managed directory", err))
		}
		fmt.Fprintln(stdout, hfl.DYADKey(rel, c.Locator.KeyDepth, c.Locator.KeyBins))
	}
	return nil
}
