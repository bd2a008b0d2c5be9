//go:build ucx

package ucx

// Peers authenticate with dtl/peerauth's challenge-response over the job
// secret, as on TCP. The owner proves first: a consumer learns that an
// owner lacks the secret before it proves anything, and an owner has
// checked the consumer's proof before it answers any request. The labels
// name this transport, its version and the direction, so that no proof
// can be replayed across transports.
const (
	labelServer = "dyadfs-ucx/1 server\x00"
	labelClient = "dyadfs-ucx/1 client\x00"
)
