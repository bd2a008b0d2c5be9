// Package metricstest checks, in tests, what a metrics endpoint serves.
package metricstest

import (
	"os/exec"
	"strings"
	"testing"
)

// CheckFormat fails t if promtool rejects text, a scrape in the text
// format Prometheus reads. Without promtool it skips t: the format check
// is the last of a test's checks.
func CheckFormat(t testing.TB, text string) {
	t.Helper()
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Skip("promtool is not installed (Debian's prometheus package; scripts/setup.sh installs it): the format check is skipped")
	}
	cmd := exec.Command(promtool, "check", "metrics")
	cmd.Stdin = strings.NewReader(text)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("promtool check metrics: %v\n%s", err, out)
	}
}
