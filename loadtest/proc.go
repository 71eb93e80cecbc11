package loadtest

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
)

// clockTicks is CLK_TCK, the unit of utime and stime in /proc/<pid>/stat. It
// is 100 on every Linux architecture Go supports (the kernel's USER_HZ), and
// reading it properly needs cgo's sysconf.
const clockTicks = 100

// ProcSampler reads a Linux process's CPU time and peak RSS from /proc.
// The zero value (PID 0) samples nothing. It holds no state and is safe for
// concurrent use.
type ProcSampler struct {
	PID int // process to sample, e.g. the gateway's exec.Cmd.Process.Pid
}

// ProcSample is one reading of a process.
type ProcSample struct {
	CPUSeconds        float64 // user + system CPU time since the process started, 10 ms resolution
	RSSHighWaterBytes int64   // VmHWM: the process's peak resident set size so far
}

// Enabled reports whether p names a process to sample.
func (p ProcSampler) Enabled() bool { return p.PID > 0 }

// Sample reads the process's CPU time and RSS high-water mark.
func (p ProcSampler) Sample() (ProcSample, error) {
	cpu, err := p.CPUSeconds()
	if err != nil {
		return ProcSample{}, err
	}
	hwm, err := p.RSSHighWater()
	if err != nil {
		return ProcSample{}, err
	}
	return ProcSample{CPUSeconds: cpu, RSSHighWaterBytes: hwm}, nil
}

// CPUSeconds returns (utime + stime) / CLK_TCK from /proc/<pid>/stat.
func (p ProcSampler) CPUSeconds() (float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.PID))
	if err != nil {
		return 0, fmt.Errorf("cpu of pid %d: %w", p.PID, err)
	}
	ticks, err := parseStatTicks(b)
	if err != nil {
		return 0, fmt.Errorf("cpu of pid %d: %w", p.PID, err)
	}
	return float64(ticks) / clockTicks, nil
}

// RSSHighWater returns VmHWM from /proc/<pid>/status, in bytes.
func (p ProcSampler) RSSHighWater() (int64, error) { return p.statusBytes("VmHWM:") }

// RSS returns the current resident set size (VmRSS), in bytes.
func (p ProcSampler) RSS() (int64, error) { return p.statusBytes("VmRSS:") }

// statusBytes reads a "Key: n kB" line of /proc/<pid>/status, in bytes.
func (p ProcSampler) statusBytes(key string) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.PID))
	if err != nil {
		return 0, fmt.Errorf("rss of pid %d: %w", p.PID, err)
	}
	n, err := parseStatusKB(b, key)
	if err != nil {
		return 0, fmt.Errorf("rss of pid %d: %w", p.PID, err)
	}
	return n * 1024, nil
}

// parseStatTicks returns utime + stime (fields 14 and 15) of a /proc/<pid>/stat
// line. Field 2, the command name in parentheses, may itself contain spaces and
// parentheses, so fields are counted from the last ')'.
func parseStatTicks(stat []byte) (int64, error) {
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, fmt.Errorf("stat %q: no command name", stat)
	}
	f := bytes.Fields(stat[i+1:]) // f[0] is field 3 (state)
	if len(f) < 13 {
		return 0, fmt.Errorf("stat %q: %d fields after the command name, want 13+", stat, len(f))
	}
	utime, err := strconv.ParseInt(string(f[11]), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("stat utime: %w", err)
	}
	stime, err := strconv.ParseInt(string(f[12]), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("stat stime: %w", err)
	}
	return utime + stime, nil
}

// parseStatusKB returns the value of a "Key:   1234 kB" line of /proc/<pid>/status.
func parseStatusKB(status []byte, key string) (int64, error) {
	for line := range bytes.Lines(status) {
		rest, ok := bytes.CutPrefix(line, []byte(key))
		if !ok {
			continue
		}
		f := bytes.Fields(rest)
		if len(f) != 2 || string(f[1]) != "kB" {
			return 0, fmt.Errorf("status %s %q: want \"<n> kB\"", key, bytes.TrimSpace(rest))
		}
		n, err := strconv.ParseInt(string(f[0]), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("status %s: %w", key, err)
		}
		return n, nil
	}
	return 0, fmt.Errorf("status: no %s line", key)
}
