package main

import (
	"bytes"
	"strings"
	"testing"
)

// TestHelpFits: every command's help fits 80 columns, status --help lists
// --json, mount --help has examples and shows each default once, and
// --version answers as a flag.
func TestHelpFits(t *testing.T) {
	for _, cmd := range []string{"", "mount", "unmount", "status", "wait", "prefetch", "forget", "key"} {
		var out bytes.Buffer
		args := []string{"help"}
		if cmd != "" {
			args = append(args, cmd)
		}
		if err := run(args, &out); err != nil && err != errHelp {
			t.Fatalf("dyadfs help %s: %v", cmd, err)
		}
		for _, line := range strings.Split(out.String(), "\n") {
			if len(line) > 80 {
				t.Errorf("dyadfs help %s: a line of %d columns: %q", cmd, len(line), line)
			}
		}
		switch cmd {
		case "status":
			if !strings.Contains(out.String(), "--json") {
				t.Errorf("status help lists no --json:\n%s", out.String())
			}
		case "mount":
			if !strings.Contains(out.String(), "Examples:") || strings.Contains(out.String(), "(default: the hostname") {
				t.Errorf("mount help: no examples, or a default shown twice:\n%s", out.String())
			}
		}
	}
	var out bytes.Buffer
	if err := run([]string{"--version"}, &out); err != nil || !strings.HasPrefix(out.String(), "dyadfs ") {
		t.Fatalf("dyadfs --version: %v %q", err, out.String())
	}
}
