package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"
)

// healthCommand is "fanwire health": an HTTP probe of a fanwire endpoint, so
// that an image without curl (distroless) can run a HEALTHCHECK with the
// binary itself. Exit 0 on a 2xx, 1 otherwise with one line on stderr.
func healthCommand() *command {
	c := newCommand("health", "Probe a fanwire HTTP endpoint (for container health checks): exit 0 on a 2xx, 1 otherwise.")
	c.usage = `GETs --url once, without a proxy and without following redirects. Any answer but
2xx, or none within --timeout, exits 1 with the reason on one line of stderr.
Point it at /healthz (the process is up) or /readyz (it consumes and is not
draining); "fanwire ingest" serves them on its own --listen (default port 8081).`
	var (
		target  string
		timeout time.Duration
		tc      probeTLS
	)
	c.fs.StringVar(&target, "url", "http://127.0.0.1:8080/healthz", "the URL to GET")
	c.fs.DurationVar(&timeout, "timeout", 2*time.Second, "give up after this long (connecting, the answer's headers and a short body)")
	c.fs.StringVar(&tc.ca, "tls-ca", "", "https: PEM file of the CA(s) that issued the server's certificate (default: the system's), e.g. for a gateway with --tls-cert")
	c.fs.StringVar(&tc.serverName, "tls-server-name", "", "https: the name the server's certificate must hold, when it is not --url's host (a certificate for the public name, probed on 127.0.0.1)")
	c.run = func([]string) error {
		return probe(target, timeout, tc)
	}
	return c
}

// probeTLS is how probe checks an https server's certificate.
type probeTLS struct {
	ca         string // PEM CA bundle; "": the system's
	serverName string // "": the URL's host
}

func (p probeTLS) config() (*tls.Config, error) {
	tc := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: p.serverName}
	if p.ca != "" {
		b, err := os.ReadFile(p.ca)
		if err != nil {
			return nil, fmt.Errorf("--tls-ca: %w", err)
		}
		tc.RootCAs = x509.NewCertPool()
		if !tc.RootCAs.AppendCertsFromPEM(b) {
			return nil, fmt.Errorf("--tls-ca %s: no PEM certificate in it", p.ca)
		}
	}
	return tc, nil
}

// probe GETs target and returns nil on a 2xx, or an error of one line.
func probe(target string, timeout time.Duration, pt probeTLS) error {
	u, err := url.Parse(target)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("--url %q: want an http:// or https:// URL with a host", target)
	}
	if timeout <= 0 {
		return fmt.Errorf("--timeout %v: want a positive duration", timeout)
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, target, nil)
	if err != nil {
		return fmt.Errorf("GET %s: %v", target, err)
	}
	tc, err := pt.config()
	if err != nil {
		return err
	}
	client := &http.Client{
		Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true, TLSClientConfig: tc},
		CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse
		},
	}
	resp, err := client.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("GET %s: no answer within %v", target, timeout)
		}
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return fmt.Errorf("GET %s: %s", target, oneLine(err.Error()))
	}
	defer resp.Body.Close()
	// A little of the body says why (/readyz: {"status":"not ready","reasons":[…]}).
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		return nil
	}
	msg := fmt.Sprintf("GET %s: %s", target, resp.Status)
	if b := oneLine(string(body)); b != "" {
		msg += ": " + b
	}
	return errors.New(msg)
}

// oneLine folds s onto one line of at most 200 bytes.
func oneLine(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > 200 {
		s = s[:200] + "…"
	}
	return s
}
