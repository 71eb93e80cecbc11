package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"sync"

	"github.com/fanwire/fanwire/gateway"
	"go.uber.org/zap"
)

// startAdmin serves srv's inspector (gateway.Server.AdminHandler) on addr
// ("": not at all, it is on --listen) until stop. stop shuts the server
// down gracefully within ctx, closes what is left after that, and waits
// for the server's goroutine; it may be called more than once. A failure
// to listen is an error at start naming the flag.
func startAdmin(addr string, srv *gateway.Server, log *zap.Logger) (stop func(context.Context) error, err error) {
	if addr == "" {
		return func(context.Context) error { return nil }, nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--admin-listen: %w", err)
	}
	as := srv.AdminHTTPServer()
	served := make(chan struct{})
	go func() {
		defer close(served)
		if err := as.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			log.Error("admin listener stopped: the inspector is not served", zap.Error(err))
		}
	}()
	url := "http://" + ln.Addr().String()
	log.Info("the inspector is on (--admin-key), served apart (--admin-listen): /admin/connections lists and closes this node's connections, the console's Inspector is at /",
		zap.String("inspector", url+"/admin/connections"), zap.String("console", url+"/"))
	if ap, err := netip.ParseAddrPort(ln.Addr().String()); err == nil && !privateAddr(ap.Addr()) {
		log.Warn("--admin-listen is plain HTTP on an address that is not loopback or private: anyone who reaches it may try the admin key, and the key crosses the network in clear; bind it to a private interface",
			zap.String("admin_listen", ln.Addr().String()))
	}
	var once sync.Once
	var stopErr error
	return func(ctx context.Context) error {
		once.Do(func() {
			if err := as.Shutdown(ctx); err != nil {
				_ = as.Close()
				stopErr = fmt.Errorf("admin http shutdown: %w", err)
			}
			<-served
		})
		return stopErr
	}, nil
}

// privateAddr reports whether a is loopback, private (RFC 1918, fc00::/7)
// or link-local; the unspecified address (every interface) is none of
// them.
func privateAddr(a netip.Addr) bool {
	a = a.Unmap()
	return a.IsLoopback() || a.IsPrivate() || a.IsLinkLocalUnicast()
}
