package tcp

// Peers authenticate with dtl/peerauth's challenge-response over the job
// secret. The server proves first: a client learns that a server lacks the
// secret before it sends anything of its own, and a server has checked the
// client's proof before it reads a request. The labels name this protocol's
// version and the direction.
const (
	labelServer = "dyadfs-dtl/2 server\x00"
	labelClient = "dyadfs-dtl/2 client\x00"
)
