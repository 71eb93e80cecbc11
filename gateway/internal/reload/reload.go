package reload

import (
	"fmt"
	"os"
	"slices"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Stamp is what a check compares of a file. The inode tells a file
// renamed into place (certbot, a Kubernetes secret's symlink swap) from the
// one it replaced even when both have the same size and a time stamp of
// the same clock tick (Linux stamps files at its tick, a few ms).
type Stamp struct {
	size  int64
	mtime time.Time
	inode uint64 // 0 where the platform has none
}

// Stat stamps each file.
func Stat(files ...string) ([]Stamp, error) {
	s := make([]Stamp, len(files))
	for i, f := range files {
		fi, err := os.Stat(f)
		if err != nil {
			return nil, err
		}
		s[i] = Stamp{size: fi.Size(), mtime: fi.ModTime()}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			s[i].inode = uint64(st.Ino)
		}
	}
	return s, nil
}

// Same reports whether a and b stamp the same files alike.
func Same(a, b []Stamp) bool { return slices.Equal(a, b) }

// Counts counts a file set's loads after the first.
type Counts struct {
	OK, Failed atomic.Uint64
}

// collector exports Counts as
// fanwire_file_reloads_total{file,result}.
type collector struct {
	counts *Counts          // static
	desc   *prometheus.Desc // static
}

// NewCollector exports counts under file (a fixed name per kind of
// file: tls_certificate, jwks, jwt_secret).
func NewCollector(file string, counts *Counts) prometheus.Collector {
	return &collector{counts: counts, desc: prometheus.NewDesc("fanwire_file_reloads_total",
		"Loads of changed files after start, by result: failed means the file did not load "+
			"(half written, malformed, a key that does not match) and what was loaded before is still served; "+
			"it is tried again at every check until it loads.",
		[]string{"result"}, prometheus.Labels{"file": file})}
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(c.desc, prometheus.CounterValue, float64(c.counts.OK.Load()), "ok")
	ch <- prometheus.MustNewConstMetric(c.desc, prometheus.CounterValue, float64(c.counts.Failed.Load()), "failed")
}

// ErrString is err's message, for a log line that compares failures.
func ErrString(err error) string { return fmt.Sprint(err) }
