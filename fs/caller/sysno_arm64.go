package caller

// arm64 syscall numbers (include/uapi/asm-generic/unistd.h); arm64 has no open(2).
const (
	sysOpen    = -1
	sysOpenat  = 56
	sysOpenat2 = 437
)
