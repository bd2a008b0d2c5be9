package ucx

import "fmt"

// Stats counts what a Transport did and shows its buffer pools. Counters
// only grow; the pool and endpoint figures are the current ones.
type Stats struct {
	Dials     int64 // endpoints a client opened and authenticated
	Reused    int64 // fetches and messages that went out on an open endpoint
	Retried   int64 // fetches and messages retried because an open endpoint had gone stale
	Accepts   int64 // endpoints a server accepted
	Served    int64 // files a server sent completely
	Refused   int64 // requests, messages and peers a server refused
	BytesSent int64 // data bytes a server sent
	BytesRecv int64 // data bytes a client received
	Messages  int64 // messages a client sent and had a reply to
	Answered  int64 // messages a server's handler answered

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
