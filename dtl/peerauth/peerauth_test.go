package peerauth

import "testing"

// A proof holds only for its secret, label, nonces and node ids.
func TestProofBindsEverything(t *testing.T) {
	secret := []byte("0123456789abcdef0123456789abcdef")
	p := Proof{ClientNonce: NewNonce(), ServerNonce: NewNonce(), ClientNode: "n1", ServerNode: "n0"}
	m := Sign(secret, "server", p)
	if !Valid(secret, "server", p, m) {
		t.Fatal("a proof does not check against itself")
	}
	other := p
	other.ClientNonce = NewNonce()
	swapped := p
	swapped.ClientNode, swapped.ServerNode = p.ServerNode, p.ClientNode
	// Node ids are length-prefixed: moving a byte between them changes
	// the proof.
	shifted := Proof{ClientNonce: p.ClientNonce, ServerNonce: p.ServerNonce, ClientNode: "n", ServerNode: "1n0"}
	for name, c := range map[string]struct {
		secret []byte
		label  string
		p      Proof
	}{
		"another secret": {[]byte("another secret of enough length!"), "server", p},
		"another label":  {secret, "client", p},
		"another nonce":  {secret, "server", other},
		"swapped nodes":  {secret, "server", swapped},
		"shifted nodes":  {secret, "server", shifted},
	} {
		if Valid(c.secret, c.label, c.p, m) {
			t.Errorf("%s: the proof still checks", name)
		}
	}
	if NewNonce() == NewNonce() {
		t.Fatal("two nonces are equal")
	}
}
