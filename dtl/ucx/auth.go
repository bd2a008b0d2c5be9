//go:build ucx

package ucx

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
)

// Mutual challenge-response over the job secret, as the TCP transport
// does it (dtl/tcp/auth.go): each side sends a fresh nonce and its node
// id, and proves it holds the secret with
//
//	HMAC-SHA256(secret, label || client nonce || server nonce ||
//	            u8 len || client node || u8 len || server node)
//
// The labels name this transport, its version and the direction, so that
// no proof can be replayed as the other side's, on another endpoint, or
// across transports. The owner proves first: a consumer learns that an
// owner lacks the secret before it proves anything, and an owner has
// checked the consumer's proof before it answers any request. Nothing is
// encrypted (DYAD's transports do not either).
const (
	labelServer = "dyadfs-ucx/1 server\x00"
	labelClient = "dyadfs-ucx/1 client\x00"
)

func newNonce() [nonceLen]byte {
	var n [nonceLen]byte
	rand.Read(n[:]) // never fails (crypto/rand panics rather than return short)
	return n
}

// proof is what a MAC covers besides the secret and the label.
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
