package dtl

import (
	"errors"
	"net"
)

// Wire codes: how the binary transports (TCP, UCX) say why an owner
// answered with an error. The numbers are part of their protocols.
const (
	CodeNotFound     = uint16(1)
	CodeNotPublished = uint16(2)
	CodeBusy         = uint16(3)
	CodeOutside      = uint16(4)
	CodeUnauthorized = uint16(5)
	CodeVersion      = uint16(6)  // the hello's version is not spoken
	CodeProtocol     = uint16(7)  // the peer broke the protocol
	CodeInternal     = uint16(8)  // the owner failed (I/O error opening the file, ...)
	CodeRefused      = uint16(9)  // a message's handler failed, or there is none (ErrRefused)
	CodeUnreadable   = uint16(10) // the owner cannot read its file (ErrUnreadable)
)

// refusalCodes maps the codes that stand for a refusal to their errors.
var refusalCodes = map[uint16]error{
	CodeNotFound:     ErrNotFound,
	CodeNotPublished: ErrNotPublished,
	CodeBusy:         ErrBusy,
	CodeOutside:      ErrOutside,
	CodeUnauthorized: ErrUnauthorized,
	CodeRefused:      ErrRefused,
	CodeUnreadable:   ErrUnreadable,
}

// CodeOf is the wire code a Source's or a message handler's error is sent
// with: its refusal's, or CodeInternal.
func CodeOf(err error) uint16 {
	for code, e := range refusalCodes {
		if errors.Is(err, e) {
			return code
		}
	}
	return CodeInternal
}

// RefusalOf is the refusal a wire code stands for, if it stands for one.
func RefusalOf(code uint16) (error, bool) {
	err, ok := refusalCodes[code]
	return err, ok
}

// FirstIPv4 is this host's first IPv4 address that is up, not loopback and
// not link-local (127.0.0.1 if there is none): the address a transport
// advertises when told nothing else.
func FirstIPv4() string {
	ifs, err := net.Interfaces()
	if err != nil {
		return "127.0.0.1"
	}
	for _, ifc := range ifs {
		if ifc.Flags&net.FlagUp == 0 || ifc.Flags&net.FlagLoopback != 0 {
			continue
		}
		addrs, err := ifc.Addrs()
		if err != nil {
			continue
		}
		for _, a := range addrs {
			if ipn, ok := a.(*net.IPNet); ok {
				if ip4 := ipn.IP.To4(); ip4 != nil && !ip4.IsLoopback() && !ip4.IsLinkLocalUnicast() {
					return ip4.String()
				}
			}
		}
	}
	return "127.0.0.1"
}
