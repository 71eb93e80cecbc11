package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"time"

	"github.com/fanwire/fanwire/broker"
	"github.com/nats-io/nats-server/v2/server"
)

// devChild is a gateway the loadtest started as a child process.
type devChild struct {
	cmd     *exec.Cmd
	exited  chan struct{}  // closed by the waiter once cmd has exited; nil before Start
	dir     string         // its data directory (role dev), or the embedded NATS server's store (role ws)
	ns      *server.Server // role ws: the NATS server embedded here, shut down by stop; nil when another child owns it
	wsURL   string
	natsURL string
}

// spawnGateway starts "fanwire dev" or "fanwire ws" of the binary exe
// ("": this one) on free ports with a fresh data directory and waits until
// /readyz says ready. Role ws gets a NATS server embedded in this process.
func spawnGateway(ctx context.Context, exe, role string, extra []string) (*devChild, error) {
	exe, err := spawnExe(exe)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "fanwire-loadtest-")
	if err != nil {
		return nil, fmt.Errorf("spawn: %w", err)
	}
	ch := &devChild{dir: dir}
	var args []string
	switch role {
	case "dev":
		natsPort, err := freePort()
		if err != nil {
			ch.stop()
			return nil, err
		}
		ch.natsURL = "nats://127.0.0.1:" + strconv.Itoa(natsPort)
		args = []string{"dev", "--nats-port", strconv.Itoa(natsPort), "--data-dir", dir}
	case "ws":
		ns, err := broker.StartEmbedded(broker.EmbeddedConfig{JetStream: true, StoreDir: dir})
		if err != nil {
			ch.stop()
			return nil, fmt.Errorf("spawn: %w", err)
		}
		ch.ns, ch.natsURL = ns, ns.ClientURL()
		args = wsArgs(ch.natsURL)
	default:
		ch.stop()
		return nil, fmt.Errorf("--spawn-role %q: want dev or ws", role)
	}
	if err := ch.start(ctx, exe, args, extra); err != nil {
		return nil, err
	}
	return ch, nil
}

// spawnStormPair starts two "fanwire ws" nodes of exe on one NATS server
// embedded in this process (and so on one JetStream stream, or, by extra,
// one Redis stream): a reconnect storm's node A and node B. Stop a before
// b: b owns the NATS server.
func spawnStormPair(ctx context.Context, exe string, extra []string) (a, b *devChild, err error) {
	if b, err = spawnGateway(ctx, exe, "ws", extra); err != nil {
		return nil, nil, err
	}
	exe, err = spawnExe(exe)
	if err != nil {
		b.stop()
		return nil, nil, err
	}
	a = &devChild{natsURL: b.natsURL}
	if err := a.start(ctx, exe, wsArgs(b.natsURL), extra); err != nil {
		b.stop()
		return nil, nil, err
	}
	return a, b, nil
}

// spawnExe is the binary to spawn: exe, or this one when exe is "".
func spawnExe(exe string) (string, error) {
	if exe == "" {
		self, err := os.Executable()
		if err != nil {
			return "", fmt.Errorf("spawn: %w", err)
		}
		return self, nil
	}
	if _, err := exec.LookPath(exe); err != nil {
		return "", fmt.Errorf("--spawn-binary: %w", err)
	}
	return exe, nil
}

// wsArgs are the arguments of a "fanwire ws" child on natsURL.
func wsArgs(natsURL string) []string {
	return []string{"ws", "--nats-url", natsURL, "--allow-anonymous"}
}

// start runs exe with args on a free port, then extra, and waits until
// /readyz says ready. On failure the child is stopped.
func (c *devChild) start(ctx context.Context, exe string, args, extra []string) error {
	httpPort, err := freePort()
	if err != nil {
		c.stop()
		return err
	}
	listen := "127.0.0.1:" + strconv.Itoa(httpPort)
	c.wsURL = "ws://" + listen + "/ws"
	args = append(append(args, "--listen", listen, "--console=false", "--log-level", "warn"), extra...)
	cmd := exec.Command(exe, args...)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		c.stop()
		return fmt.Errorf("spawn %s: %w", exe, err)
	}
	c.cmd, c.exited = cmd, make(chan struct{})
	go func() { // owned by c: stop waits for it
		_ = cmd.Wait()
		close(c.exited)
	}()
	deadline := time.Now().Add(20 * time.Second)
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+listen+"/readyz", nil)
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			c.stop()
			return fmt.Errorf("spawned gateway not ready at %s within 20s", listen)
		}
		select {
		case <-c.exited:
			c.stop()
			return fmt.Errorf("spawned gateway exited before it was ready at %s: %s", listen, cmd.ProcessState)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// terminate sends SIGTERM, as a rolling restart does, and returns once the
// child has exited (it drains and closes its connections with 1001 first),
// or when ctx ends.
func (c *devChild) terminate(ctx context.Context) error {
	if err := c.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		return fmt.Errorf("SIGTERM: %w", err)
	}
	select {
	case <-c.exited:
		// A drain past --shutdown-timeout exits 1 after cutting the
		// connections left: the clients' closes other than 1001 show it.
		if st := c.cmd.ProcessState; !st.Success() {
			fmt.Fprintf(os.Stderr, "loadtest: the node stopped with SIGTERM %s\n", st)
		}
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// stop ends the child with SIGTERM (graceful), SIGKILL after 10 s, then
// the embedded NATS server if it owns one. Stopping an exited child only
// cleans up.
func (c *devChild) stop() {
	if c.cmd != nil {
		select {
		case <-c.exited:
		default:
			_ = c.cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-c.exited:
			case <-time.After(10 * time.Second):
				_ = c.cmd.Process.Kill()
				<-c.exited
			}
		}
	}
	if c.ns != nil {
		c.ns.Shutdown()
		c.ns.WaitForShutdown()
	}
	if c.dir != "" {
		os.RemoveAll(c.dir)
	}
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
