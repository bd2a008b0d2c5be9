package ucx

import "errors"

// ErrNotBuilt is what New returns in a build without UCX.
var ErrNotBuilt = errors.New("transport ucx: dyadfs was built without UCX; install libucx-dev (Debian: apt-get install libucx-dev) and build with -tags ucx (scripts/setup.sh does)")
