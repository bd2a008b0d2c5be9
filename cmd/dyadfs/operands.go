package main

import (
	"errors"
	"fmt"
	"io"

	"github.com/spf13/pflag"
)

// parseOperands parses the arguments of the subcommand flags.Name(), which
// acts on one or more operands (operand names them in messages, e.g.
// PATH). --help prints usage and the flags to stdout and returns errHelp; a
// bad flag or no operand is a usage error that points to the command's
// help.
func parseOperands(flags *pflag.FlagSet, args []string, usage, operand string, stdout io.Writer) error {
	name := flags.Name()
	flags.Usage = func() {}
	if err := flags.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			fmt.Fprint(stdout, usage+flags.FlagUsagesWrapped(helpWidth))
			return errHelp
		}
		return fail(exitUsage, err.Error()+" (see dyadfs help "+name+")")
	}
	if flags.NArg() == 0 {
		return fail(exitUsage, fmt.Sprintf("%s takes at least one %s (see dyadfs help %s)", name, operand, name))
	}
	return nil
}
