package loadtest

import (
	"errors"
	"io/fs"
	"os"
	"testing"
	"time"
)

func TestProcSamplerSelf(t *testing.T) {
	p := ProcSampler{PID: os.Getpid()}
	before, err := p.Sample()
	if err != nil {
		t.Fatal(err)
	}
	// Burn CPU until the kernel has charged at least two ticks more (20 ms);
	// poll with a deadline rather than guess a duration.
	deadline := time.Now().Add(10 * time.Second)
	var after ProcSample
	for x := uint64(1); ; {
		for range 1_000_000 {
			x = x*6364136223846793005 + 1
		}
		cpuSink = x
		if after, err = p.Sample(); err != nil {
			t.Fatal(err)
		}
		if after.CPUSeconds >= before.CPUSeconds+0.02 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("cpu went from %.2fs to %.2fs in 10s of spinning", before.CPUSeconds, after.CPUSeconds)
		}
	}
	if after.CPUSeconds <= 0 {
		t.Errorf("cpu = %v, want > 0", after.CPUSeconds)
	}
	if after.RSSHighWaterBytes <= 0 || after.RSSHighWaterBytes%1024 != 0 {
		t.Errorf("rss high-water = %d, want a positive number of KiB", after.RSSHighWaterBytes)
	}
	if !p.Enabled() || (ProcSampler{}).Enabled() {
		t.Errorf("Enabled: pid %d → %v, zero → %v", p.PID, p.Enabled(), ProcSampler{}.Enabled())
	}
}

var cpuSink uint64

func TestProcSamplerNoProcess(t *testing.T) {
	_, err := ProcSampler{PID: 1 << 30}.Sample() // above pid_max's ceiling (4M)
	if !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("err = %v, want fs.ErrNotExist", err)
	}
}

func TestParseStatTicks(t *testing.T) {
	tests := []struct {
		name string
		stat string
		want int64
		ok   bool
	}{
		{"plain", "1234 (fanwire) S 1 1234 1234 0 -1 4194560 100 0 0 0 250 75 0 0 20 0 8 0 100 0 0", 325, true},
		{"name with spaces and parens", "99 (a b) c)) R 1 99 99 0 -1 0 0 0 0 0 7 3 0 0 20 0 1 0 1 0 0", 10, true},
		{"truncated", "99 (x) R 1 2 3", 0, false},
		{"no name", "99 x R", 0, false},
		{"bad number", "1 (x) S 1 1 1 0 -1 0 0 0 0 0 ab 1 0", 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseStatTicks([]byte(tt.stat))
			if (err == nil) != tt.ok || got != tt.want {
				t.Errorf("parseStatTicks = %d, %v; want %d, ok=%v", got, err, tt.want, tt.ok)
			}
		})
	}
}

func TestParseStatusKB(t *testing.T) {
	status := "Name:\tfanwire\nVmPeak:\t  900000 kB\nVmHWM:\t   41234 kB\nVmRSS:\t   40000 kB\n"
	if got, err := parseStatusKB([]byte(status), "VmHWM:"); err != nil || got != 41234 {
		t.Errorf("VmHWM = %d, %v; want 41234", got, err)
	}
	if _, err := parseStatusKB([]byte("Name:\tx\n"), "VmHWM:"); err == nil {
		t.Errorf("missing VmHWM: want an error")
	}
	if _, err := parseStatusKB([]byte("VmHWM:\t12 MB\n"), "VmHWM:"); err == nil {
		t.Errorf("unknown unit: want an error")
	}
}
