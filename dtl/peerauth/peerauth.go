// Package peerauth is the mutual challenge-response with which the
// transports' peers prove they hold the job secret. Each side sends a fresh
// random nonce and its node id; each proves it holds the secret with
//
//	HMAC-SHA256(secret, label || client nonce || server nonce ||
//	            u8 len || client node || u8 len || server node)
//
// where the label names the transport, its protocol version and the
// direction, so that no proof can be replayed as the other side's, on
// another connection, or across transports, and the node ids are those both
// sides announced, so that a peer in the middle cannot swap either without
// the secret. (Any daemon of the job may still announce any node id; what
// the MACs rule out is a stranger altering the ids on the wire.) Nothing is
// encrypted: the secret keeps strangers from reading files and sending
// messages, it does not hide them on the wire (DYAD's transports do
// neither).
package peerauth

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
)

// NonceLen and MACLen are the sizes on the wire.
const (
	NonceLen = 32
	MACLen   = sha256.Size
)

// MaxNode is the longest node id a proof covers (its length is one byte).
const MaxNode = 255

// NewNonce returns a fresh random nonce.
func NewNonce() [NonceLen]byte {
	var n [NonceLen]byte
	rand.Read(n[:]) // never fails (crypto/rand panics rather than return short)
	return n
}

// Proof is what a MAC covers besides the secret and the label. The node ids
// are at most MaxNode bytes (as the wire carries them).
type Proof struct {
	ClientNonce, ServerNonce [NonceLen]byte
	ClientNode, ServerNode   string
}

// Sign is the MAC that proves, under label, that its sender holds secret.
func Sign(secret []byte, label string, p Proof) [MACLen]byte {
	h := hmac.New(sha256.New, secret)
	b := make([]byte, 0, len(label)+2*NonceLen+2+len(p.ClientNode)+len(p.ServerNode))
	b = append(b, label...)
	b = append(b, p.ClientNonce[:]...)
	b = append(b, p.ServerNonce[:]...)
	b = appendStr8(b, p.ClientNode)
	b = appendStr8(b, p.ServerNode)
	h.Write(b)
	var m [MACLen]byte
	h.Sum(m[:0])
	return m
}

// Valid tells, in constant time, whether got is Sign(secret, label, p).
func Valid(secret []byte, label string, p Proof, got [MACLen]byte) bool {
	want := Sign(secret, label, p)
	return hmac.Equal(want[:], got[:])
}

func appendStr8(b []byte, s string) []byte {
	if len(s) > MaxNode {
		s = s[:MaxNode]
	}
	b = append(b, byte(len(s)))
	return append(b, s...)
}
