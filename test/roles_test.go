package test

import (
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/dyadfs/dyadfs/fs"
)

// Who waits: a read-only open of a path published nowhere waits, unless its
// process says it does not (DYADFS_WAIT, DYAD_PATH_PRODUCER), or the mount's
// default says so (--wait-missing=false) and the process does not ask to
// wait (DYADFS_WAIT=1, DYAD_PATH_CONSUMER). Every waiting open is listed in
// the status and logged when it lasts.

// TestSqliteAsProducer: the sqlite3 shell opens a new database read-only
// before it creates it; as a producer it gets ENOENT and goes on.
func TestSqliteAsProducer(t *testing.T) {
	requireSqlite(t)
	m := newMount(t)
	r := run(t, m.mnt, "sh", "-ec", "DYAD_PATH_PRODUCER="+m.mnt+" sqlite3 "+m.path("new.db")+
		" 'create table t(x); insert into t values (42);' && sqlite3 new.db 'select x from t'")
	if r.err != nil || r.stdout != "42\n" {
		t.Fatalf("sqlite3 as a producer: %v", r)
	}
	// The same as a process that says nothing: it waits (as a consumer
	// of new2.db would), listed in the status with who it is.
	waiting := start(t, m.mnt, "sqlite3", m.path("new2.db"), "create table t(x)")
	m.waitStatus("sqlite3 listed as waiting", func(st fs.Status) bool {
		return len(st.Waiters) == 1 && st.Waiters[0].Path == "new2.db" && st.Waiters[0].Command == "sqlite3" && st.Waiters[0].Pid > 0
	})
	if r, still := notYet(waiting); !still {
		t.Fatalf("sqlite3 finished instead of waiting: %v", r)
	}
	out, err := dyadfs(t, "status", m.mnt)
	if err != nil || !strings.Contains(out, "waiting opens (1)") || !strings.Contains(out, "sqlite3") || !strings.Contains(out, "new2.db") {
		t.Fatalf("dyadfs status does not show the waiting open: %v\n%s", err, out)
	}
}

// TestWhoWaits: the variables and the mount's default decide.
func TestWhoWaits(t *testing.T) {
	m := newMount(t, "--wait-log-after", "300ms")
	enoent := func(env, rel string) {
		t.Helper()
		start := time.Now()
		r := run(t, m.mnt, "sh", "-c", env+" cat "+rel)
		if r.err == nil || !strings.Contains(r.stderr, "No such file") || time.Since(start) > 5*time.Second {
			t.Fatalf("%s cat %s: %v after %v, want ENOENT at once", env, rel, r, time.Since(start))
		}
	}
	waits := func(env, rel string, before func()) {
		t.Helper()
		ch := start(t, m.mnt, "sh", "-c", env+" cat "+rel)
		m.waitStatus(rel+" waited for", func(st fs.Status) bool {
			for _, w := range st.Waiters {
				if w.Path == rel {
					return true
				}
			}
			return false
		})
		if before != nil {
			before()
		}
		mustSh(t, m.mnt, "printf here > "+rel)
		if r := within(t, "cat "+rel, bound, ch); r.err != nil || r.stdout != "here" {
			t.Fatalf("%s cat %s: %v", env, rel, r)
		}
	}
	enoent("DYADFS_WAIT=0", "a")
	enoent("DYAD_PATH_PRODUCER="+m.mnt, "b")
	enoent("DYAD_PATH_PRODUCER=.", "b2") // relative to the working directory: the mount
	waits("DYAD_PATH_PRODUCER=/elsewhere", "c", nil)
	waits("DYADFS_WAIT=1 DYAD_PATH_PRODUCER="+m.mnt, "d", nil)
	waits("", "e", func() {
		eventually(t, "the long wait logged", func() bool {
			return strings.Contains(m.readLog(), `msg="an open has been waiting long" path=e pid=`)
		})
	})

	// Configuration files libraries probe at start-up never wait, even
	// for a consumer; --never-wait names others, or none.
	enoent("DYAD_PATH_CONSUMER="+m.mnt, "ucx.conf")
	probes := newMount(t, "--never-wait", "*.probe,x?.ini")
	for _, rel := range []string{"a.probe", "dir/b.probe", "x1.ini"} {
		if r := run(t, probes.mnt, "cat", rel); r.err == nil || !strings.Contains(r.stderr, "No such file") {
			t.Fatalf("cat %s under --never-wait: %v", rel, r)
		}
	}
	all := newMount(t, "--never-wait", "")
	ucxConf := start(t, all.mnt, "cat", "ucx.conf")
	all.waitStatus("ucx.conf waited for under --never-wait ''", waiting(1))
	mustSh(t, all.mnt, "printf conf > ucx.conf")
	if r := within(t, "cat ucx.conf", bound, ucxConf); r.err != nil || r.stdout != "conf" {
		t.Fatalf("cat ucx.conf under --never-wait '': %v", r)
	}

	nowait := newMount(t, "--wait-missing=false")
	r := run(t, nowait.mnt, "cat", "f")
	if r.err == nil || !strings.Contains(r.stderr, "No such file") {
		t.Fatalf("cat under --wait-missing=false: %v", r)
	}
	ch := start(t, nowait.mnt, "sh", "-c", "DYAD_PATH_CONSUMER="+nowait.mnt+" cat g")
	nowait.waitStatus("the consumer waits", func(st fs.Status) bool { return len(st.Waiters) == 1 })
	mustSh(t, nowait.mnt, "printf g > g")
	if r := within(t, "the consumer", bound, ch); r.err != nil || r.stdout != "g" {
		t.Fatalf("a consumer under --wait-missing=false: %v", r)
	}
}

// TestUCXProgramStartsInMount: a program linked with UCX (MPI programs
// are) reads ./ucx.conf before main; started in the mount, it must not wait
// for it.
func TestUCXProgramStartsInMount(t *testing.T) {
	requireEnv(t)
	if _, err := exec.LookPath("ucx_info"); err != nil {
		t.Skip("skipping: ucx_info is not installed (Debian's ucx-utils): run scripts/setup.sh")
	}
	m := newMount(t)
	ch := start(t, m.mnt, "ucx_info", "-v")
	if r := within(t, "ucx_info -v started in the mount", bound, ch); r.err != nil || !strings.Contains(r.stdout, "Version") {
		t.Fatalf("ucx_info -v in the mount: %v", r)
	}
	if st := m.status(); len(st.Waiters) != 0 {
		t.Fatalf("waiting opens after ucx_info: %+v", st.Waiters)
	}
}

func requireSqlite(t *testing.T) {
	t.Helper()
	requireEnv(t)
	if _, err := exec.LookPath("sqlite3"); err != nil {
		t.Skip("skipping: sqlite3 is not installed: run scripts/setup.sh")
	}
}
