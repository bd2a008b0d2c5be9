package tcp

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
)

// Mutual challenge-response over the job secret. Each side sends a fresh
// random nonce and its node id; each proves it holds the secret with
//
//	HMAC-SHA256(secret, label || client nonce || server nonce ||
//	            u8 len || client node || u8 len || server node)
//
// where the label names the protocol version and the direction, so that
// neither side's proof can be replayed as the other's nor on another
// connection, and the node ids are those of the hello and the challenge,
// so that a proof binds the names both sides announced: a peer in the
// middle cannot swap either name without the secret. (The secret is the
// job's: any daemon of the job may still announce any node id; what the
// MACs rule out is a stranger altering the ids on the wire.) The server
// proves first: a client learns that a server lacks the secret before it
// sends anything of its own, and a server has checked the client's proof
// before it reads a request. Nothing is encrypted: the secret keeps
// strangers from reading files and sending messages, it does not hide them
// on the wire (DYAD's transports do neither).
const (
	labelServer = "dyadfs-dtl/2 server\x00"
	labelClient = "dyadfs-dtl/2 client\x00"
)

func newNonce() [nonceLen]byte {
	var n [nonceLen]byte
	rand.Read(n[:]) // never fails (crypto/rand panics rather than return short)
	return n
}

// proof is what a MAC covers besides the secret and the label. The node
// ids are at most maxNode bytes (as the wire carries them).
type proof struct {
	clientNonce, serverNonce [nonceLen]byte
	clientNode, serverNode   string
}

func mac(secret []byte, label string, p proof) [macLen]byte {
	h := hmac.New(sha256.New, secret)
	b := make([]byte, 0, len(label)+2*nonceLen+2+len(p.clientNode)+len(p.serverNode))
	b = append(b, label...)
	b = append(b, p.clientNonce[:]...)
	b = append(b, p.serverNonce[:]...)
	b = appendStr8(b, p.clientNode)
	b = appendStr8(b, p.serverNode)
	h.Write(b)
	var m [macLen]byte
	h.Sum(m[:0])
	return m
}

// validMAC compares in constant time.
func validMAC(secret []byte, label string, p proof, got [macLen]byte) bool {
	want := mac(secret, label, p)
	return hmac.Equal(want[:], got[:])
}
