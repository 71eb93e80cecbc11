package metrics

import "github.com/prometheus/client_golang/prometheus"

// Collector exports a WAL's counters as fanwire_wal_messages_total{kind,route}.
// Each Collect takes a Snapshot, so the ingest loop pays nothing for
// Prometheus and a scrape never changes a counter.
type Collector struct {
	wal  *WAL             // static after NewCollector
	desc *prometheus.Desc // static after NewCollector
}

// NewCollector returns a collector for w. Register it on the role's registry.
func NewCollector(w *WAL) *Collector {
	return &Collector{
		wal: w,
		desc: prometheus.NewDesc("fanwire_wal_messages_total",
			"pgoutput messages received, by message kind and by what the ingest did with them "+
				"(publish: produced events; state: only updated ingest state; skip: in no projection).",
			[]string{"kind", "route"}, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	for _, cell := range c.wal.Snapshot() {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.CounterValue, float64(cell.Messages),
			cell.Kind.String(), cell.Route.String())
	}
}
