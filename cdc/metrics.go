package cdc

import (
	"github.com/fanwire/fanwire/metrics"
	"github.com/prometheus/client_golang/prometheus"
)

// Collector exports the ingest's metrics. Values are read from the
// ingest's atomics at scrape time: the hot path pays nothing for them.
func (in *Ingest) Collector() prometheus.Collector {
	return &collector{in: in, wal: metrics.NewCollector(&in.wal)}
}

type collector struct {
	in  *Ingest
	wal *metrics.Collector // fanwire_wal_messages_total{kind,route}
}

var (
	descConfirmed = prometheus.NewDesc("fanwire_ingest_confirmed_lsn", "The WAL position confirmed to PostgreSQL (as a number): everything before it is in the broker.", nil, nil)
	descWALEnd    = prometheus.NewDesc("fanwire_ingest_server_wal_end_lsn", "The server's WAL end, as last reported on the replication connection.", nil, nil)
	descLagBytes  = prometheus.NewDesc("fanwire_ingest_lag_bytes", "WAL bytes between the server's WAL end and the confirmed position.", nil, nil)
	descLagSecs   = prometheus.NewDesc("fanwire_ingest_lag_seconds", "Age of the oldest committed transaction whose events the broker has not acknowledged yet (0 when caught up).", nil, nil)
	descPublished = prometheus.NewDesc("fanwire_ingest_events_published_total", "Events the broker acknowledged.", nil, nil)
	descBootRows  = prometheus.NewDesc("fanwire_ingest_bootstrap_rows_total", "Rows published by bootstraps.", nil, nil)
	descReady     = prometheus.NewDesc("fanwire_ingest_ready", "1 while the ingest is tailing its slot.", nil, nil)
	descStandby   = prometheus.NewDesc("fanwire_ingest_standby", "1 while the ingest waits for another ingest of its slot to end (failover).", nil, nil)
	descTakeovers = prometheus.NewDesc("fanwire_ingest_takeovers_total", "Times this ingest took its slot over after waiting as a standby.", nil, nil)
	descBadRows   = prometheus.NewDesc("fanwire_ingest_error_events_total", "Rows and documents that could not be published (a value the encoder refuses, an event over the broker's size limit, a row of a table without a key) and were published as error events on <prefix>.%errors.>, by reason.", []string{"reason"}, nil)
	descQueueEvs  = prometheus.NewDesc("fanwire_ingest_queue_events", "Events handed to the publisher and not acknowledged by the broker yet (bounded by Config.QueueEvents).", nil, nil)
	descQueueB    = prometheus.NewDesc("fanwire_ingest_queue_bytes", "Bytes of those events (bounded by Config.QueueBytes).", nil, nil)
	descSpilled   = prometheus.NewDesc("fanwire_ingest_spilled_transactions_total", "Transactions whose changes outgrew --max-txn-memory and went to a spill file under --state-dir.", nil, nil)
	descSpilledB  = prometheus.NewDesc("fanwire_ingest_spilled_bytes_total", "Bytes written to spill files.", nil, nil)
	descMarksLost = prometheus.NewDesc("fanwire_ingest_high_water_lost_total", "Starts at which the broker held no event of this ingest though it had stored some (purged, expired, evicted): the changes read again were published again, with only the duplicate window to drop repeats.", nil, nil)
	descMemRows   = prometheus.NewDesc("fanwire_projection_memory_rows", "Rows the memory-mode projections hold.", nil, nil)
	descMemBytes  = prometheus.NewDesc("fanwire_projection_memory_value_bytes", "Bytes of the encoded column values the memory-mode projections hold (the process's memory is more: maps and indexes).", nil, nil)
)

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descConfirmed, descWALEnd, descLagBytes, descLagSecs, descPublished, descBootRows, descReady, descStandby, descTakeovers, descBadRows, descQueueEvs, descQueueB, descSpilled, descSpilledB, descMarksLost, descMemRows, descMemBytes} {
		ch <- d
	}
	c.wal.Describe(ch)
	c.in.commitToAck.Describe(ch)
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	in := c.in
	confirmed, end := in.confirmed.Load(), in.walEnd.Load()
	lag := 0.0
	if end > confirmed {
		lag = float64(end - confirmed)
	}
	ready := 0.0
	if in.Ready() {
		ready = 1
	}
	ch <- prometheus.MustNewConstMetric(descConfirmed, prometheus.GaugeValue, float64(confirmed))
	ch <- prometheus.MustNewConstMetric(descWALEnd, prometheus.GaugeValue, float64(end))
	ch <- prometheus.MustNewConstMetric(descLagBytes, prometheus.GaugeValue, lag)
	ch <- prometheus.MustNewConstMetric(descLagSecs, prometheus.GaugeValue, in.lagSeconds())
	ch <- prometheus.MustNewConstMetric(descPublished, prometheus.CounterValue, float64(in.published.Load()))
	ch <- prometheus.MustNewConstMetric(descBootRows, prometheus.CounterValue, float64(in.bootRows.Load()))
	ch <- prometheus.MustNewConstMetric(descReady, prometheus.GaugeValue, ready)
	standby := 0.0
	if in.Standby() {
		standby = 1
	}
	ch <- prometheus.MustNewConstMetric(descStandby, prometheus.GaugeValue, standby)
	ch <- prometheus.MustNewConstMetric(descTakeovers, prometheus.CounterValue, float64(in.takeovers.Load()))
	ch <- prometheus.MustNewConstMetric(descBadRows, prometheus.CounterValue, float64(in.badRows[0].Load()), badValue)
	ch <- prometheus.MustNewConstMetric(descBadRows, prometheus.CounterValue, float64(in.badRows[1].Load()), badTooLarge)
	ch <- prometheus.MustNewConstMetric(descBadRows, prometheus.CounterValue, float64(in.badRows[2].Load()), badNoKey)
	var qEvents int
	var qBytes int64
	if q := in.queue.Load(); q != nil {
		qEvents, qBytes = q.used()
	}
	ch <- prometheus.MustNewConstMetric(descQueueEvs, prometheus.GaugeValue, float64(qEvents))
	ch <- prometheus.MustNewConstMetric(descQueueB, prometheus.GaugeValue, float64(qBytes))
	ch <- prometheus.MustNewConstMetric(descSpilled, prometheus.CounterValue, float64(in.spilled.Load()))
	ch <- prometheus.MustNewConstMetric(descSpilledB, prometheus.CounterValue, float64(in.spillB.Load()))
	ch <- prometheus.MustNewConstMetric(descMarksLost, prometheus.CounterValue, float64(in.marksLost.Load()))
	rows, bytes := in.MemoryState()
	ch <- prometheus.MustNewConstMetric(descMemRows, prometheus.GaugeValue, float64(rows))
	ch <- prometheus.MustNewConstMetric(descMemBytes, prometheus.GaugeValue, float64(bytes))
	c.wal.Collect(ch)
	c.in.commitToAck.Collect(ch)
}
