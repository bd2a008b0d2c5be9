package dmd

import (
	"os"
	"syscall"
	"testing"

	"github.com/dyadfs/dyadfs/dtl"
)

// inoAt is the inode number the mount shows for backing path rel.
func (fx *fixture) inoAt(rel string) uint64 {
	fx.t.Helper()
	var st syscall.Stat_t
	birth, err := fx.d.Backing().LstatGen(rel, &st)
	if err != nil {
		fx.t.Fatal(err)
	}
	return fx.d.Ino(IDOf(&st), birth)
}

// TestInodeNumbersFollowTheFile: a file born here is numbered from this
// node; a copy shows the number its record carries, and keeps it once
// written here (its publish carries it on) and across a restart.
func TestInodeNumbersFollowTheFile(t *testing.T) {
	fx := newFixture(t, nil)
	fx.write("own.dat", "mine")
	own := fx.inoAt("own.dat")
	if rec, err := fx.record("own.dat"); err != nil || rec.Ino != own || own == 0 {
		t.Fatalf("own file shows %d; its record %+v, %v", own, rec, err)
	}
	const theirs = 123456789
	if err := fx.d.Install(fx.fetched(t, "copy"), dtl.Version{Path: "c.dat", Owner: "n2", Ino: theirs, Info: dtl.FileInfo{Generation: 3}}); err != nil {
		t.Fatal(err)
	}
	if got := fx.inoAt("c.dat"); got != theirs {
		t.Fatalf("a copy shows %d, its record says %d", got, theirs)
	}
	w, f := fx.openWrite("c.dat", os.O_WRONLY|os.O_APPEND)
	f.WriteString("+")
	fx.end(w, f, "c.dat")
	if rec, err := fx.record("c.dat"); err != nil || rec.Owner != "n1" || rec.Ino != theirs {
		t.Fatalf("written here, the copy's record is %+v, %v; want n1's with inode %d", rec, err, theirs)
	}
	if !fx.d.markers {
		return
	}
	// A daemon started again over the backing directory.
	fx.d.Close()
	cfg := fx.d.cfg
	d := newDMD(t, cfg, fx.store)
	if _, err := d.Scan(fx.ctx()); err != nil {
		t.Fatal(err)
	}
	fx.d = d
	if got := fx.inoAt("c.dat"); got != theirs {
		t.Fatalf("after a restart the file shows %d, it showed %d", got, theirs)
	}
	if got := fx.inoAt("own.dat"); got != own {
		t.Fatalf("after a restart this node's file shows %d, it showed %d", got, own)
	}
}

// TestInodeNumberOfReusedInode: a file born in an inode a removed file
// had is another file, with another number (the removed one's may live on
// in copies elsewhere).
func TestInodeNumberOfReusedInode(t *testing.T) {
	fx := newFixture(t, nil)
	id := FileID{Dev: fx.d.Backing().Dev(), Ino: 4242}
	if a, b := fx.d.Ino(id, 1000), fx.d.Ino(id, 2000); a == b || a == 0 || b == 0 {
		t.Fatalf("inode 4242 born at two times shows %d and %d", a, b)
	}
}
