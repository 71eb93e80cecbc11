package brokertest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// DebianNATS is where Debian's nats-server package installs the server
// (`make deps` installs it): the version users of that distribution run,
// older than the one embedded in fanwire.
const DebianNATS = "/usr/sbin/nats-server"

// NATSBinary starts the nats-server binary at path as a process, with
// JetStream, its store in t.TempDir(), on a free loopback port, and returns
// its client URL once JetStream answers; t.Cleanup stops it. It tests
// fanwire against a server as a distribution ships it rather than the
// embedded one. A missing binary fails the test, saying how to install it.
func NATSBinary(t testing.TB, path string) string {
	t.Helper()
	url, _ := NATSProcess(t, path)
	return url
}

// NATSProcess is NATSBinary, also returning the server's process id (to
// read its CPU time and memory in /proc).
func NATSProcess(t testing.TB, path string) (url string, pid int) {
	t.Helper()
	if testing.Short() {
		t.Skip("-short (make test-quick) leaves out the tests that start a nats-server process: make test runs them")
	}
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("brokertest: nats-server binary %s: %v (run `make deps`, which installs Debian's nats-server package, or apt-get install nats-server)", path, err)
	}
	dir := t.TempDir()
	attempt := 0
	startOnFreePorts(t, func() (err error) {
		attempt++
		url, pid, err = startNATSProcess(t, path, dir, attempt)
		return err
	})
	return url, pid
}

// startNATSProcess starts the nats-server binary at path on a free port
// and waits until its JetStream answers as itself: under a name of its
// own, since a server of another test that holds the port (ours then
// exits) would answer too. The process is stopped by t.Cleanup.
func startNATSProcess(t testing.TB, path, dir string, attempt int) (url string, pid int, err error) {
	port := freePort(t)
	name := fmt.Sprintf("brokertest-%d-%d", os.Getpid(), port)
	logFile := filepath.Join(dir, fmt.Sprintf("nats-server-%d.log", attempt))
	cmd := exec.Command(path, "-a", "127.0.0.1", "-p", strconv.Itoa(port), "-n", name, "-js", "-sd", filepath.Join(dir, "store"), "-l", logFile)
	if err := cmd.Start(); err != nil {
		return "", 0, fmt.Errorf("start %s: %w", path, err)
	}
	exited := make(chan struct{})
	go func() { // owned by the process: ends when it does (the cleanup waits for it)
		_ = cmd.Wait()
		close(exited)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	})
	url = "nats://127.0.0.1:" + strconv.Itoa(port)
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := jetStreamAnswersAt(url, name)
		if err == nil {
			return url, cmd.Process.Pid, nil
		}
		select {
		case <-exited:
			log, _ := os.ReadFile(logFile)
			return "", 0, portTaken(fmt.Errorf("%s exited: %v\n%s", path, cmd.ProcessState, log), string(log))
		default:
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(logFile)
			return "", 0, fmt.Errorf("%s: JetStream not answering on %s: %v\n%s", path, url, err, log)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// jetStreamAnswersAt asks the JetStream API at url once, of the server
// named name: another one on the port (a server of another test) is not
// the one asked for.
func jetStreamAnswersAt(url, name string) error {
	nc, err := nats.Connect(url, nats.Timeout(time.Second))
	if err != nil {
		return err
	}
	defer nc.Close()
	if got := nc.ConnectedServerName(); got != name {
		return fmt.Errorf("answered by server %q, not %q", got, name)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_, err = js.AccountInfo(ctx)
	return err
}

// NATSServerBinary is FANWIRE_BENCH_NATS_BIN, or nats-server built from
// the version of github.com/nats-io/nats-server/v2 in go.mod (the server
// fanwire embeds, newer than Debian's), cached under the user's cache
// directory (or a temp dir without one): benchmarks measure the broker
// users run beside fanwire.
func NATSServerBinary(tb testing.TB) string {
	tb.Helper()
	if bin := os.Getenv("FANWIRE_BENCH_NATS_BIN"); bin != "" {
		return bin
	}
	const mod = "github.com/nats-io/nats-server/v2"
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Version}}", mod).Output()
	if err != nil {
		tb.Fatalf("go list -m %s: %v", mod, err)
	}
	version := strings.TrimSpace(string(out))
	dir, err := os.UserCacheDir()
	if err != nil {
		dir = os.TempDir()
	}
	dir = filepath.Join(dir, "fanwire-bench")
	bin := filepath.Join(dir, "nats-server-"+version)
	if _, err := os.Stat(bin); err == nil {
		return bin
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		tb.Fatal(err)
	}
	tmp := fmt.Sprintf("%s.%d.tmp", bin, os.Getpid())
	if out, err := exec.Command("go", "build", "-o", tmp, mod).CombinedOutput(); err != nil {
		tb.Fatalf("go build %s: %v\n%s", mod, err, out)
	}
	if err := os.Rename(tmp, bin); err != nil {
		tb.Fatal(err)
	}
	return bin
}
