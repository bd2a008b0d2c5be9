// Package size parses and prints byte counts as people write them: 64MiB,
// 1.5G, 4096.
package size

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// units maps a suffix (lower case, without a trailing "b") to its factor.
// K, M, G, T and P are powers of 1024, as df and du mean them; kB, MB...
// are powers of 1000.
var units = map[string]float64{
	"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40, "p": 1 << 50,
	"ki": 1 << 10, "mi": 1 << 20, "gi": 1 << 30, "ti": 1 << 40, "pi": 1 << 50,
}

var decimal = map[string]float64{"kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12, "pb": 1e15}

// Parse reads a byte count: a number, optionally with a fraction, and a
// unit (K, KiB, M, MiB, G, GiB, T, TiB, P, PiB: powers of 1024; kB, MB, GB,
// TB, PB: powers of 1000; B or none: bytes).
func Parse(s string) (int64, error) {
	t := strings.TrimSpace(s)
	i := strings.IndexFunc(t, func(r rune) bool { return (r < '0' || r > '9') && r != '.' })
	num, unit := t, ""
	if i >= 0 {
		num, unit = t[:i], strings.ToLower(strings.TrimSpace(t[i:]))
	}
	v, err := strconv.ParseFloat(num, 64)
	if err != nil || num == "" {
		return 0, fmt.Errorf("%q: want a size such as 4096, 64MiB or 1.5G", s)
	}
	f, ok := decimal[unit]
	if !ok {
		f, ok = units[strings.TrimSuffix(unit, "b")]
	}
	if !ok {
		return 0, fmt.Errorf("%q: unknown unit %q (want K, M, G, T, P, with or without iB, or kB, MB, GB)", s, unit)
	}
	b := v * f
	if b > math.MaxInt64 {
		return 0, fmt.Errorf("%q: too large", s)
	}
	return int64(b), nil
}

// Format prints n bytes with a binary unit, three significant digits.
func Format(n int64) string {
	const units = "KMGTPE"
	if n < 1024 && n > -1024 {
		return fmt.Sprintf("%d B", n)
	}
	v := float64(n)
	u := -1
	for math.Abs(v) >= 1024 && u < len(units)-1 {
		v /= 1024
		u++
	}
	switch {
	case math.Abs(v) >= 100:
		return fmt.Sprintf("%.0f %ciB", v, units[u])
	case math.Abs(v) >= 10:
		return fmt.Sprintf("%.1f %ciB", v, units[u])
	}
	return fmt.Sprintf("%.2f %ciB", v, units[u])
}
