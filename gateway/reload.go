package gateway

import (
	"fmt"
	"os"
	"slices"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Files loaded again when they change (the listener's certificate, the
// token keys) share a rule: a check stats them, at most once per
// interval; when they differ from the files as last LOADED, they are
// loaded; a load that fails keeps what is served and is tried again at
// every check until one succeeds. Comparing with the last attempt instead
// would give up on a pair caught half written (the certificate before its
// key) whenever the rest arrives with the same size and time stamp (same
// key type; an mtime kept by rsync -t or a coarse file system): the old
// certificate would stay forever.

// fileStamp is what a check compares of a file. The inode tells a file
// renamed into place (certbot, a Kubernetes secret's symlink swap) from the
// one it replaced even when both have the same size and a time stamp of
// the same clock tick (Linux stamps files at its tick, a few ms).
type fileStamp struct {
	size  int64
	mtime time.Time
	inode uint64 // 0 where the platform has none
}

// statFiles stamps each file.
func statFiles(files ...string) ([]fileStamp, error) {
	s := make([]fileStamp, len(files))
	for i, f := range files {
		fi, err := os.Stat(f)
		if err != nil {
			return nil, err
		}
		s[i] = fileStamp{size: fi.Size(), mtime: fi.ModTime()}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			s[i].inode = uint64(st.Ino)
		}
	}
	return s, nil
}

// sameStamps reports whether a and b stamp the same files alike.
func sameStamps(a, b []fileStamp) bool { return slices.Equal(a, b) }

// reloadCounts counts a file set's loads after the first.
type reloadCounts struct {
	ok, failed atomic.Uint64
}

// reloadCollector exports reloadCounts as
// fanwire_file_reloads_total{file,result}.
type reloadCollector struct {
	counts *reloadCounts    // static
	desc   *prometheus.Desc // static
}

// newReloadCollector exports counts under file (a fixed name per kind of
// file: tls_certificate, jwks, jwt_secret).
func newReloadCollector(file string, counts *reloadCounts) prometheus.Collector {
	return &reloadCollector{counts: counts, desc: prometheus.NewDesc("fanwire_file_reloads_total",
		"Loads of changed files after start, by result: failed means the file did not load "+
			"(half written, malformed, a key that does not match) and what was loaded before is still served; "+
			"it is tried again at every check until it loads.",
		[]string{"result"}, prometheus.Labels{"file": file})}
}

func (c *reloadCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *reloadCollector) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(c.desc, prometheus.CounterValue, float64(c.counts.ok.Load()), "ok")
	ch <- prometheus.MustNewConstMetric(c.desc, prometheus.CounterValue, float64(c.counts.failed.Load()), "failed")
}

// errString is err's message, for a log line that compares failures.
func errString(err error) string { return fmt.Sprint(err) }
