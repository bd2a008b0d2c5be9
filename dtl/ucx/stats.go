package ucx

import (
	"fmt"

	"github.com/dyadfs/dyadfs/dtl/wire"
)

// Stats counts what a Transport did and shows its buffer pools. Counters
// only grow; the pool and endpoint figures are the current ones.
type Stats struct {
	wire.Stats // the counters every binary transport keeps

	// The registered buffer pools: slots in all and slots free now. Once
	// transfers are over (every UCX request completed), Free equals
	// Slots again.
	SendSlots, SendFree int
	RecvSlots, RecvFree int
	// Endpoints open now, and UCX requests whose completion has not
	// arrived yet.
	Endpoints, InFlight int64
}

// StatusError is a failure UCX reported: what failed and the library's
// ucs_status_t.
type StatusError struct {
	Op     string // the call or event that failed
	Status int    // the ucs_status_t, a negative number
	Text   string // ucs_status_string's words for it
}

func (e *StatusError) Error() string {
	return fmt.Sprintf("%s: %s (UCX status %d)", e.Op, e.Text, e.Status)
}
