package main

import (
	"net"
	"os"
	"strings"
)

// The mount(8) form: mount -t fuse.dyadfs dyadfs /mnt/dmd -o OPTIONS (and
// its /etc/fstab line) has mount.fuse3 run
//
//	dyadfs SOURCE MOUNTPOINT -o OPTIONS
//
// Every mount flag is accepted as an option (backing=/local/dmd,
// store=etcd://host:2379, wait-timeout=10m; '_' for '-' too); the options
// mount(8) and fstab add for themselves are dropped; the rest are FUSE
// mount options (allow_other, ro, nosuid, ...).

// commands are the dyadfs subcommands: anything else first is the
// mount(8) form's SOURCE.
var commands = map[string]bool{"mount": true, "unmount": true, "umount": true, "status": true, "wait": true,
	"prefetch": true, "key": true, "forget": true, "version": true, "help": true}

// isMount8Form reports whether args are the mount(8) form.
func isMount8Form(args []string) bool {
	return len(args) >= 2 && !commands[args[0]] && !strings.HasPrefix(args[0], "-") && !strings.HasPrefix(args[1], "-")
}

// fstabOnly are options of mount(8) and fstab that are not the
// filesystem's.
func fstabOnly(name string) bool {
	switch name {
	case "defaults", "auto", "noauto", "user", "users", "nouser", "owner", "group", "_netdev", "nofail":
		return true
	}
	return strings.HasPrefix(name, "x-") || strings.HasPrefix(name, "comment=")
}

// mount8Args turns the mount(8) form into dyadfs mount's arguments.
func mount8Args(args []string) ([]string, error) {
	mountpoint := args[1]
	var opts []string
	rest := args[2:]
	for i := 0; i < len(rest); i++ {
		switch a := rest[i]; {
		case a == "-o" && i+1 < len(rest):
			opts = append(opts, splitOptions(rest[i+1])...)
			i++
		case strings.HasPrefix(a, "-o"):
			opts = append(opts, splitOptions(a[2:])...)
		default:
			// -n, -v, -s (sloppy) and the like: mount(8)'s own.
		}
	}
	c, err := defaultMountConfig()
	if err != nil {
		return nil, err
	}
	flags, _ := mountFlags(&c)
	out := []string{}
	var fuseOpts []string
	for _, o := range opts {
		name, value, hasValue := strings.Cut(o, "=")
		if fstabOnly(name) || fstabOnly(o) {
			continue
		}
		flagName := strings.ReplaceAll(name, "_", "-")
		if f := flags.Lookup(flagName); f != nil && flagName != "options" {
			if hasValue {
				out = append(out, "--"+flagName+"="+value)
			} else {
				out = append(out, "--"+flagName)
			}
			continue
		}
		fuseOpts = append(fuseOpts, o)
	}
	if len(fuseOpts) > 0 {
		out = append(out, "-o", strings.Join(fuseOpts, ","))
	}
	return append(out, "--", mountpoint), nil
}

// splitOptions splits a comma-separated option list; a comma inside a
// value (store=etcd://a:2379,b:2379) stays when what follows has no '='
// and is not an option name of its own (host:port).
func splitOptions(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p == "" {
			continue
		}
		if n := len(out); n > 0 && strings.Contains(out[n-1], "=") && !strings.Contains(p, "=") && looksLikeHostPort(p) {
			out[n-1] += "," + p
			continue
		}
		out = append(out, p)
	}
	return out
}

func looksLikeHostPort(s string) bool {
	_, _, err := net.SplitHostPort(s)
	return err == nil
}

// notifySystemd tells systemd, in a unit of Type=notify, that the mount is
// ready (sd_notify READY=1, without libsystemd).
func notifySystemd(state string) {
	addr := os.Getenv("NOTIFY_SOCKET")
	if addr == "" {
		return
	}
	if strings.HasPrefix(addr, "@") {
		addr = "\x00" + addr[1:] // an abstract socket
	}
	conn, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: addr, Net: "unixgram"})
	if err != nil {
		return
	}
	defer conn.Close()
	conn.Write([]byte(state))
}
