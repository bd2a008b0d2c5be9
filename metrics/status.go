package metrics

import (
	"reflect"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
)

// statusCollector turns the status into metrics at each scrape, so that
// every counter the status shows is a metric without a second set of
// counters to keep in step. The status's types say what each value is:
//
//   - unsigned integers count events: counters, named ..._total;
//   - floats named ..._total are counters too (seconds waited in all);
//   - other numbers (ints, floats) and booleans are gauges (files busy
//     now, uptime);
//   - a map of numbers is one metric with the map's key as a label (errors
//     by errno, operations by name); a map of structs, one metric per
//     field with that label; a map[string]any adds sections by name;
//   - values in s, ms or µs (a name part s, ms, us) are given in seconds;
//   - strings of a map[string]string become labels of a dyadfs_info gauge;
//     lists and other strings are left out.
//
// A field's metric tag says more: "-" leaves it out (what the process and
// Go collectors give already, and settings, which are not measurements);
// "inline" adds its fields, or its map's sections, without its own name
// (dyadfs_publishes_total, not dyadfs_dmd_publishes_total); "gauge" makes
// an unsigned value a gauge. Its help tag is the metric's HELP text;
// without one, the HELP text is made of the name's words. A count named
// ..._count is ..._total.
type statusCollector struct {
	status func() any
}

// Describe sends nothing: the metrics follow the status, whose sections
// (the transport's) depend on the configuration.
func (c *statusCollector) Describe(chan<- *prometheus.Desc) {}

func (c *statusCollector) Collect(ch chan<- prometheus.Metric) {
	f := flattener{ch: ch, seen: make(map[string]bool), help: make(map[string]string), gauges: make(map[string]bool)}
	f.walk("dyadfs", "", "", reflect.ValueOf(c.status()))
}

type flattener struct {
	ch   chan<- prometheus.Metric
	seen map[string]bool // name and label value: each metric once
	// help and gauges hold, by metric name before its suffix, the help
	// and gauge tags of the fields.
	help   map[string]string
	gauges map[string]bool
}

// walk emits v under name; label, if set, is the label name and value
// carries its value.
func (f *flattener) walk(name, label, value string, v reflect.Value) {
	for v.Kind() == reflect.Interface || v.Kind() == reflect.Pointer {
		if v.IsNil() {
			return
		}
		v = v.Elem()
	}
	switch v.Kind() {
	case reflect.Struct:
		t := v.Type()
		for i := range t.NumField() {
			sf := t.Field(i)
			if !sf.IsExported() {
				continue
			}
			tag := strings.Split(sf.Tag.Get("json"), ",")[0]
			mtag := sf.Tag.Get("metric")
			if tag == "-" || mtag == "-" {
				continue
			}
			if tag == "" {
				tag = sf.Name
			}
			fname := name + "_" + sanitize(tag)
			if mtag == "inline" {
				fname = name
			}
			if h := sf.Tag.Get("help"); h != "" {
				f.help[fname] = h
			}
			if mtag == "gauge" {
				f.gauges[fname] = true
			}
			f.walk(fname, label, value, v.Field(i))
		}
	case reflect.Map:
		if v.Type().Key().Kind() != reflect.String {
			return
		}
		elem := v.Type().Elem()
		switch {
		case elem.Kind() == reflect.String:
			f.info(name, v)
		case elem.Kind() == reflect.Interface:
			// Sections by name (the transport's counters).
			for _, k := range v.MapKeys() {
				f.walk(name+"_"+sanitize(k.String()), label, value, v.MapIndex(k))
			}
		case label == "":
			// Keyed by what the section's name says: op, errno, ...
			key := labelName(name)
			for _, k := range v.MapKeys() {
				f.walk(name, key, k.String(), v.MapIndex(k))
			}
		}
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		if f.gauges[name] {
			f.emit(name, prometheus.GaugeValue, float64(v.Uint()), label, value)
			break
		}
		f.emit(strings.TrimSuffix(name, "_count")+"_total", prometheus.CounterValue, float64(v.Uint()), label, value)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		f.emit(name, prometheus.GaugeValue, float64(v.Int()), label, value)
	case reflect.Float32, reflect.Float64:
		if strings.HasSuffix(name, "_total") {
			f.emit(name, prometheus.CounterValue, v.Float(), label, value)
		} else {
			f.emit(name, prometheus.GaugeValue, v.Float(), label, value)
		}
	case reflect.Bool:
		b := 0.0
		if v.Bool() {
			b = 1
		}
		f.emit(name, prometheus.GaugeValue, b, label, value)
	}
}

func (f *flattener) emit(name string, typ prometheus.ValueType, v float64, label, value string) {
	if strings.HasSuffix(name, "_total_total") {
		name = strings.TrimSuffix(name, "_total")
	}
	// Prometheus wants base units: a part of the name that is s, ms or
	// us becomes seconds.
	parts := strings.Split(name, "_")
	for i, p := range parts {
		scale, ok := map[string]float64{"s": 1, "ms": 1e-3, "us": 1e-6}[p]
		if ok {
			parts[i] = "seconds"
			v *= scale
			name = strings.Join(parts, "_")
			break
		}
	}
	key := name + "\x00" + value
	if f.seen[key] {
		return
	}
	f.seen[key] = true
	var labels []string
	if label != "" {
		labels = []string{label}
	}
	desc := prometheus.NewDesc(name, f.helpOf(name, typ, label), labels, nil)
	var m prometheus.Metric
	var err error
	if label != "" {
		m, err = prometheus.NewConstMetric(desc, typ, v, value)
	} else {
		m, err = prometheus.NewConstMetric(desc, typ, v)
	}
	if err == nil {
		f.ch <- m
	}
}

// helpOf is the HELP text of metric name: its field's help tag, or its
// name's words (dyadfs_fetch_errors_total: "Fetch errors, counted since the
// daemon started.").
func (f *flattener) helpOf(name string, typ prometheus.ValueType, label string) string {
	for _, k := range []string{name, strings.TrimSuffix(name, "_total"), strings.TrimSuffix(name, "_seconds"), strings.TrimSuffix(name, "_total") + "_count"} {
		if h, ok := f.help[k]; ok {
			return h
		}
	}
	words := strings.ReplaceAll(strings.TrimSuffix(strings.TrimPrefix(name, "dyadfs_"), "_total"), "_", " ")
	if words != "" {
		words = strings.ToUpper(words[:1]) + words[1:]
	}
	by := ""
	if label != "" {
		by = ", by " + label
	}
	if typ == prometheus.CounterValue {
		return words + by + ", counted since the daemon started."
	}
	return words + by + ", now."
}

// info emits the strings of m as the labels of one gauge of value 1.
func (f *flattener) info(name string, m reflect.Value) {
	if name != "dyadfs_info" || f.seen[name] {
		return
	}
	f.seen[name] = true
	var keys, values []string
	for _, k := range m.MapKeys() {
		switch k.String() {
		case "log_file", "metrics":
			continue // where the daemon writes, not what it is set to
		}
		keys = append(keys, sanitize(k.String()))
		values = append(values, m.MapIndex(k).String())
	}
	desc := prometheus.NewDesc(name, "dyadfs's settings: version, store, transport, ... (value 1).", keys, nil)
	if metric, err := prometheus.NewConstMetric(desc, prometheus.GaugeValue, 1, values...); err == nil {
		f.ch <- metric
	}
}

// labelName is the label of a map's keys, from the map's metric name.
func labelName(name string) string {
	switch {
	case strings.HasSuffix(name, "errno"), strings.HasSuffix(name, "failed_for_good"):
		return "errno"
	case strings.HasSuffix(name, "_ops"):
		return "op"
	}
	return "key"
}

// sanitize makes s a metric name part: lower case, [a-z0-9_].
func sanitize(s string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(s) {
		if (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9') || r == '_' {
			b.WriteRune(r)
		} else {
			b.WriteByte('_')
		}
	}
	return b.String()
}
