// Command testreport reads `go test -json` on its standard input and
// prints what a reader of a CI log needs: the packages' result lines, the
// whole output of every test that failed, the skipped tests with their
// reasons, and at the end the slowest tests, so that the suite's time
// stays in view. Lines that are not JSON (build errors) pass through.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strings"
)

type event struct {
	Action  string
	Package string
	Test    string
	Output  string
	Elapsed float64
}

type timing struct {
	name    string
	seconds float64
}

func main() {
	out := bufio.NewWriter(os.Stdout)
	defer out.Flush()
	held := make(map[string]*strings.Builder) // output of tests still running
	var slow []timing
	var failed []string
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 64<<20)
	for in.Scan() {
		line := in.Bytes()
		var e event
		if len(line) == 0 || line[0] != '{' || json.Unmarshal(line, &e) != nil {
			fmt.Fprintln(out, string(line))
			out.Flush()
			continue
		}
		if e.Test == "" {
			// The package's own lines: "ok pkg 12s", "FAIL", a panic
			// outside any test. "PASS" alone says nothing more.
			if e.Action == "output" && strings.TrimSpace(e.Output) != "PASS" {
				fmt.Fprint(out, e.Output)
				out.Flush()
			}
			continue
		}
		key := e.Package + " " + e.Test
		switch e.Action {
		case "output":
			b := held[key]
			if b == nil {
				b = new(strings.Builder)
				held[key] = b
			}
			b.WriteString(e.Output)
		case "fail":
			if b := held[key]; b != nil {
				fmt.Fprint(out, b.String())
				out.Flush()
			}
			failed = append(failed, key)
			fallthrough
		case "pass":
			if !strings.Contains(e.Test, "/") {
				slow = append(slow, timing{key, e.Elapsed})
			}
			delete(held, key)
		case "skip":
			if b := held[key]; b != nil {
				fmt.Fprint(out, b.String())
			}
			delete(held, key)
		}
	}
	// A test binary that died mid-test: what its running tests said.
	for key, b := range held {
		fmt.Fprintf(out, "== unfinished: %s\n%s", key, b.String())
	}
	sort.Slice(slow, func(i, j int) bool { return slow[i].seconds > slow[j].seconds })
	fmt.Fprintln(out, "== the slowest tests")
	for i := 0; i < len(slow) && i < 15; i++ {
		fmt.Fprintf(out, "%8.1fs  %s\n", slow[i].seconds, slow[i].name)
	}
	if len(failed) > 0 {
		fmt.Fprintln(out, "== failed")
		for _, key := range failed {
			fmt.Fprintln(out, key)
		}
	}
}
