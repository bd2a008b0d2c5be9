package tcp

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
)

// Mutual challenge-response over the job secret. Each side sends a fresh
// random nonce; each proves it holds the secret with
//
//	HMAC-SHA256(secret, label || client nonce || server nonce)
//
// where the label names the protocol version and the direction, so that
// neither side's proof can be replayed as the other's nor on another
// connection. The server proves first: a client learns that a server lacks
// the secret before it sends anything of its own, and a server has checked
// the client's proof before it reads a request. Nothing is encrypted: the
// secret keeps strangers from reading files, it does not hide them on the
// wire (DYAD's transports do neither).
const (
	labelServer = "dyadfs-dtl/1 server\x00"
	labelClient = "dyadfs-dtl/1 client\x00"
)

func newNonce() [nonceLen]byte {
	var n [nonceLen]byte
	rand.Read(n[:]) // never fails (crypto/rand panics rather than return short)
	return n
}

func mac(secret []byte, label string, clientNonce, serverNonce [nonceLen]byte) [macLen]byte {
	h := hmac.New(sha256.New, secret)
	h.Write([]byte(label))
	h.Write(clientNonce[:])
	h.Write(serverNonce[:])
	var m [macLen]byte
	h.Sum(m[:0])
	return m
}

// validMAC compares in constant time.
func validMAC(secret []byte, label string, clientNonce, serverNonce [nonceLen]byte, got [macLen]byte) bool {
	want := mac(secret, label, clientNonce, serverNonce)
	return hmac.Equal(want[:], got[:])
}
