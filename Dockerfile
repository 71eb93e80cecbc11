# fanwire: one static binary on distroless. Build: docker build -t fanwire .
# Run: docker run -p 8080:8080 -e FANWIRE_NATS_URL=nats://nats:4222 \
#        -e FANWIRE_JWT_SECRET_FILE=/run/secrets/jwt fanwire
# (ws refuses to start without a JWT key unless FANWIRE_ALLOW_ANONYMOUS=true;
# README, "Container").

FROM golang:1.26-bookworm AS build
WORKDIR /src
# Modules first: this layer is rebuilt only when go.mod or go.sum change.
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o /out/fanwire ./cmd/fanwire

# Static binary: no libc needed. ca-certificates and tzdata come with the base.
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/fanwire /fanwire
# The nonroot user (65532) owns its home: relative paths (dev's --data-dir
# ./.fanwire, ingest's --state-dir .fanwire/ingest) land there.
WORKDIR /home/nonroot
USER 65532:65532
# 8080: ws (and dev); 8081: ingest's /healthz, /readyz, /metrics by default.
EXPOSE 8080 8081
# The default listen address is loopback, unreachable from outside a container.
ENV FANWIRE_LISTEN=0.0.0.0:8080
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --retries=3 CMD ["/fanwire","health","--url","http://127.0.0.1:8080/healthz"]
ENTRYPOINT ["/fanwire"]
CMD ["ws"]
