# Stand-ins for the public images of docker-compose.cluster.yml on a machine without a registry (the tests):
# Redis and Prometheus from Debian's packages on the local base image, with the entry points the public images have.
#   podman build -f deploy/compose/standins.Dockerfile --target redis --build-arg BASE_IMAGE=localhost/crane-base:bookworm .
ARG BASE_IMAGE=debian:bookworm-slim

FROM ${BASE_IMAGE} AS redis
RUN apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends redis-server \
 && rm -rf /var/lib/apt/lists/* && mkdir -p /data && chown redis:redis /data
WORKDIR /data
USER redis

FROM ${BASE_IMAGE} AS prometheus
RUN apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus \
 && rm -rf /var/lib/apt/lists/* && mkdir -p /prometheus && chown nobody:nogroup /prometheus
WORKDIR /prometheus
USER nobody
ENTRYPOINT ["/usr/bin/prometheus", "--storage.tsdb.path=/prometheus"]
