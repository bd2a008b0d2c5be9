// Package pagecache writes into files in pieces the page cache takes
// fast.
//
// The kernel gives a new file's page cache folios as large as the write
// that fills them. On a virtual machine whose balloon takes free memory
// back (free page reporting, in 2 MiB blocks), folios of 1 MiB come from
// memory the host has to back again when it is first touched: measured on
// the CI machines (Linux 6.18, ext4), 20 new 64 MiB files took 1 MiB
// writes at 0.75 GB/s and the same bytes in 512 KiB writes at 5.6 GB/s
// (256 KiB: 3.6-4.1 GB/s; dd shows the same with bs=1M against 512K).
// Elsewhere the extra system call per MiB costs nothing measurable.
package pagecache

import "io"

// Piece bounds one write.
const Piece = 512 << 10

// WriteAt writes p into w at off in pieces of at most Piece bytes that
// end on multiples of Piece, and returns how many bytes it wrote: all of
// them, or fewer with the first error.
func WriteAt(w io.WriterAt, p []byte, off int64) (int, error) {
	var n int
	for n < len(p) {
		at := off + int64(n)
		end := min(len(p), n+int(Piece-at%Piece))
		piece := p[n:end]
		k, err := w.WriteAt(piece, at)
		n += k
		if err != nil {
			return n, err
		}
		if k < len(piece) {
			return n, io.ErrShortWrite
		}
	}
	return n, nil
}
