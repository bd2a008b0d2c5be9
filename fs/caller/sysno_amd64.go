package caller

// x86-64 syscall numbers (arch/x86/entry/syscalls/syscall_64.tbl).
const (
	sysOpen    = 2
	sysOpenat  = 257
	sysOpenat2 = 437
)
