# A local equivalent of KWOK's cluster image (registry.k8s.io/kwok/cluster, the kwok service of docker-compose.yml)
# for machines without an image registry (the tests): KWOK's own recipe (images/cluster in sigs.k8s.io/kwok:
# kwokctl's binary runtime, the API without authentication on :8080 through kubectl proxy, upstream's entry point)
# with binaries built here instead of downloaded: kube-apiserver, kube-controller-manager and kube-scheduler from
# the sandbox's Kubernetes pin, kwok and kwokctl from its KWOK pin, kubectl (scripts/tools), etcd from Debian.
# The build context holds bin/ and entrypoint.sh (copied from the KWOK module); tests/integration/deploy builds it:
#   podman build -f deploy/compose/kwok-cluster.Dockerfile --build-arg BASE_IMAGE=localhost/crane-base:bookworm \
#     --build-arg KUBE_VERSION=v1.37.2 CONTEXT
ARG BASE_IMAGE=debian:bookworm-slim
FROM ${BASE_IMAGE}
RUN apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends etcd-server \
 && rm -rf /var/lib/apt/lists/* /usr/share/doc /usr/share/man
COPY --chmod=0755 bin/ /usr/local/bin/
COPY --chmod=0755 entrypoint.sh /entrypoint.sh
ARG KUBE_VERSION
# kwokctl shapes etcd's flags by its version: the release Debian bookworm ships
ARG ETCD_VERSION=3.4.23
ENV KWOK_RUNTIME=binary KWOK_KUBE_APISERVER_INSECURE_PORT=8080 KWOK_KUBE_APISERVER_PORT=0 \
    KWOK_KUBE_VERSION=${KUBE_VERSION} KWOK_ETCD_VERSION=${ETCD_VERSION} KWOK_ETCD_BINARY=/usr/bin/etcd \
    KWOK_KUBE_APISERVER_BINARY=/usr/local/bin/kube-apiserver \
    KWOK_KUBE_CONTROLLER_MANAGER_BINARY=/usr/local/bin/kube-controller-manager \
    KWOK_KUBE_SCHEDULER_BINARY=/usr/local/bin/kube-scheduler \
    KWOK_CONTROLLER_BINARY=/usr/local/bin/kwok KWOK_KUBECTL_BINARY=/usr/local/bin/kubectl
EXPOSE 8080
ENTRYPOINT ["/entrypoint.sh"]
